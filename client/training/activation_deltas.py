"""Activation deltas (AQ-SGD): a link sends a sample's activation whole once, and from then on only its change.

Wang et al. 2022, "Fine-tuning Language Models over Slow Networks using Activation Compression with Guarantees"
(AQ-SGD, NeurIPS 2022). For each sample ξ, a (data step, micro-batch) of the plan's repeating data order
(``ModelConfig.data_period``), both ends of a link keep m(ξ), the activation the receiver last trained on for ξ. When
ξ comes again with activation a, the sender sends q = Q(a − m(ξ)) in the plan's delta codec (4 or 2 bits,
protocol/codecs.py), and both ends set m(ξ) ← m(ξ) + q, which is the input the receiver trains on. Activations
change slowly from one pass to the next, so the change needs few levels; what Q cuts is not lost but stays in
a − m(ξ) and is sent the next time ξ comes (the argument of error feedback, client/training/error_feedback.py).

Both ends must hold the same m(ξ), bit for bit: both compute m(ξ) + Q(·) with the same decoder in float32. An
update takes effect only when its step commits (a retried attempt starts from the same copies, as it starts from
the same weights), and a delta names the copy it applies to by CRC-32. The two ends commit a step each when it has
every vote, so a sender running one step ahead may already base a delta on an update the receiver has staged but not
committed yet: the receiver applies the delta to that staged copy (the step committed at the sender, so it commits
here too, and the copies end the same). A receiver that holds no copy the delta names (it missed the update) refuses
the frame, the sender forgets its copy, and the step's retry sends that activation whole. A new
plan starts with no copies: its first pass is sent whole. Memory: one activation per sample at each end of a link,
data_period × micro_batches activations (``buffer_bytes``), which start_stage checks against a limit.
"""
import math
import zlib
from collections.abc import Hashable

import torch
from hivemind.proto import runtime_pb2

from hetswarm.protocol.codecs import decode_tensor, encode_tensor
from hetswarm.protocol.framing import FrameError
from hetswarm.protocol.keys import AttemptKey
from hetswarm.protocol.wire_format import Codec

__all__ = ["RESEND_WHOLE", "DeltaBase", "DeltaBuffers", "Sample", "buffer_bytes", "checksum"]

Sample = tuple[int, int]
"""(data step, micro-batch): the same sample comes again every data_period steps."""
RESEND_WHOLE = "send it whole"
"""How a receiver's refusal of a delta ends: the sender then forgets its copy (any other refusal leaves it)."""


class DeltaBase(FrameError):
    """A delta frame for a sample whose copy here is missing or differs from the sender's."""


def checksum(tensor: torch.Tensor) -> int:
    """CRC-32 of a float32 CPU tensor's bytes: how a delta names the copy it applies to."""
    return zlib.crc32(tensor.detach().contiguous().numpy().tobytes())


def buffer_bytes(*, data_period: int, micro_batches: int, shape: tuple[int, ...]) -> int:
    """Bytes of the copies one end of a link keeps: one float32 activation per sample of a pass."""
    return data_period * micro_batches * math.prod(shape) * 4


class DeltaBuffers:
    """One end of one link: the last activation of each sample, and the updates of attempts not yet committed."""

    def __init__(self, *, whole: Codec, delta: Codec) -> None:
        self.whole, self.delta = whole, delta
        self._copies: dict[Sample, torch.Tensor] = {}
        self._staged: dict[AttemptKey, dict[Sample, torch.Tensor]] = {}
        self.sent_whole = self.sent_delta = 0
        """Frames this end sent (or took) whole and as deltas: the first pass, then the deltas."""

    def outgoing(self, activation: torch.Tensor, *, attempt: AttemptKey, sample: Sample
                 ) -> tuple[runtime_pb2.Tensor, Codec, int | None]:
        """What the sender sends for `activation` (a float32 CPU tensor), encoded: its change against the sample's
        copy in the delta codec, with the copy's checksum; or, with no copy yet, the activation itself in the whole
        codec, with None. The receiver's reconstruction, decoded from the very message sent (it is encoded once), is
        staged as the sample's next copy."""
        copy = self._copies.get(sample)
        if copy is None:
            self.sent_whole += 1
            return self._encoded(activation, self.whole, attempt=attempt, sample=sample), self.whole, None
        self.sent_delta += 1
        message = self._encoded(activation - copy, self.delta, attempt=attempt, sample=sample, base=copy)
        return message, self.delta, checksum(copy)

    def _encoded(self, value: torch.Tensor, codec: Codec, *, attempt: AttemptKey, sample: Sample,
                 base: torch.Tensor | None = None) -> runtime_pb2.Tensor:
        message = encode_tensor(value, codec)
        decoded = decode_tensor(message, codec).to(torch.float32)
        self.stage(attempt, sample, decoded if base is None else base + decoded)
        return message

    def incoming(self, tensor: torch.Tensor, *, attempt: AttemptKey, sample: Sample, base_crc: int | None,
                 sender: Hashable) -> torch.Tensor:
        """The activation a received frame stands for (float32); `stage` it once the frame is taken.

        Raises:
            DeltaBase: the frame is a delta, and this end holds no copy of the sample or a different one.
        """
        if base_crc is None:
            received = tensor.to(torch.float32)
            self.sent_whole += 1
        else:
            copies = self._versions(sample)
            base = next((copy for copy in copies if checksum(copy) == base_crc), None)
            if base is None:
                state = "holds a different copy" if copies else "holds no copy"
                raise DeltaBase(f"{sender} sent a delta of data step {sample[0]}, micro-batch {sample[1]}, but this "
                                f"stage {state} of that activation: {RESEND_WHOLE}")
            received = base + tensor
            self.sent_delta += 1
        return received

    def _versions(self, sample: Sample) -> list[torch.Tensor]:
        """The sample's committed copy, then the updates of it that attempts staged, oldest step first (module
        docstring: a delta may name one of those)."""
        committed = [self._copies[sample]] if sample in self._copies else []
        return committed + [staged[sample] for _, staged in sorted(self._staged.items()) if sample in staged]

    def forget(self, sample: Sample) -> None:
        """Drops a sample's copy (its delta was refused), so that it is sent whole next time."""
        self._copies.pop(sample, None)

    def commit(self, attempt: AttemptKey) -> None:
        """The plan committed `attempt`: its updates become the copies; updates of its step's other attempts and of
        earlier steps are dropped (those of the next step, which a neighbour may already have sent, are kept)."""
        self._copies.update(self._staged.get(attempt, {}))
        for key in [key for key in self._staged if key[0] <= attempt[0]]:
            del self._staged[key]

    def stage(self, attempt: AttemptKey, sample: Sample, value: torch.Tensor) -> None:
        """`value` becomes the sample's copy if `attempt` is committed."""
        self._staged.setdefault(attempt, {})[sample] = value
