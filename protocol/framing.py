"""Activation and gradient frames: one tensor on a hivemind stream, tagged with where it belongs in training.

The header names the step and its attempt: a step that failed anywhere in the plan is retried under a new
attempt number with the same data, so frames of the aborted attempt can be told apart from the retry's.

A frame is a list of ``runtime_pb2.ExpertRequest`` messages. The first carries the ``FrameHeader`` (JSON in
``metadata``) and the first part of the tensor; each later message carries one more part. The tensor is
serialized in the plan's codec for its kind (protocol/codecs.py: fp32, fp16, or blockwise 8-bit quantization) and
split into FRAME_PART_BYTES parts, since hivemind messages over 4 MiB misbehave (docs/hivemind.md, pitfall 2).

An activation delta (AQ-SGD, client/training/activation_deltas.py) is a frame with ``delta`` set: its tensor is the
change against the last activation of the same sample, in the plan's delta codec, and ``base_crc`` names that last
activation (its CRC-32), so that a receiver whose copy differs refuses the frame rather than train on a wrong input.

A receiver states what it expects (``Expectation``) and reads with ``read_frame`` (a stream) or ``decode_frame``
(messages at hand). Anything else is refused with a ``FrameError`` that says what was wrong, before the tensor is
built: a malformed header, the wrong kind, assignment version, step, pipeline, micro-batch, shape or codec, a
payload that is not what the header's codec and shape make (its compression, dtype, size or byte count), or more
than ``max_frame_bytes`` in all. Bytes are counted as the
messages arrive, and reading stops at the first message past a limit.
"""
import math
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from typing import Literal

import pydantic.v1 as pydantic
import torch
from hivemind.proto import runtime_pb2
from hivemind.utils.streaming import combine_from_streaming, split_for_streaming
from pydantic.v1 import BaseModel, Extra, StrictBool, ValidationError, conint, conlist

from hetswarm.protocol.codecs import COMPRESSION_TYPES, decode_tensor, encode_tensor, wire_bytes, wire_dtype_name
from hetswarm.protocol.errors import RejectedInput
from hetswarm.protocol.limits import FRAME_PART_BYTES, MAX_FRAME_BYTES, MAX_FRAME_HEADER_BYTES
from hetswarm.protocol.wire_format import Codec

__all__ = ["Expectation", "FrameError", "FrameHeader", "VersionMismatch", "decode_frame", "encode_frame",
           "read_frame"]

FrameKind = Literal["activations", "gradients", "held-out"]
"""`held-out`: the activations of a forward-only pass on held-out text (client/training/stage_passes.py,
held_out_loss), never a delta."""

_MAX_DIMS = 8


class FrameError(RejectedInput):
    """A frame from a peer that this stage refuses; the stage keeps running."""


class VersionMismatch(FrameError):
    """A frame for another assignment version: the sender or the receiver has not yet seen the latest plan."""


class FrameHeader(BaseModel):
    """Where a tensor belongs in training, and its shape and codec, checked before its bytes are used."""

    kind: FrameKind
    assignment_version: conint(strict=True, ge=0)
    step: conint(strict=True, ge=0)
    attempt: conint(strict=True, ge=0) = 0
    """Which try of the step this frame belongs to: a step that failed anywhere is retried as attempt + 1, and
    frames of an aborted attempt must never be used in a later one (client/training/step_commit.py)."""
    micro_batch: conint(strict=True, ge=0)
    pipeline: conint(strict=True, ge=0)
    shape: conlist(conint(strict=True, ge=0), max_items=_MAX_DIMS)
    codec: Codec
    delta: StrictBool = False
    """The tensor is an activation's change against the last one of its sample (module docstring)."""
    base_crc: conint(strict=True, ge=0, lt=2**32) | None = None
    """With `delta`: the CRC-32 of the activation the change applies to."""

    class Config:
        extra = Extra.forbid
        allow_mutation = False

    @pydantic.root_validator(skip_on_failure=True)
    def _delta_names_its_base(cls, values: dict) -> dict:
        if values["delta"] != (values["base_crc"] is not None):
            raise ValueError("a delta frame, and only a delta frame, names its base_crc")
        return values

    @classmethod
    def for_tensor(
        cls, tensor: torch.Tensor, *, kind: FrameKind, codec: Codec, assignment_version: int, step: int,
        micro_batch: int, pipeline: int, attempt: int = 0, base_crc: int | None = None,
    ) -> "FrameHeader":
        """The header of ``tensor`` sent in ``codec``: its shape, with the given tags (a delta when ``base_crc``)."""
        return cls(kind=kind, assignment_version=assignment_version, step=step, attempt=attempt,
                   micro_batch=micro_batch, pipeline=pipeline, shape=list(tensor.shape), codec=codec,
                   delta=base_crc is not None, base_crc=base_crc)


@dataclass(frozen=True, kw_only=True, slots=True)
class Expectation:
    """What a receiver will accept; ``None`` leaves a tag unchecked (the caller matches it to its own queues)."""

    kind: FrameKind | tuple[FrameKind, ...]
    """The kind, or the kinds, accepted."""
    assignment_version: int
    shape: tuple[int, ...]
    codec: Codec
    delta_codec: Codec | None = None
    """The codec of delta frames; None refuses deltas."""
    step: int | None = None
    pipeline: int | None = None
    micro_batches: int | None = None
    """Micro-batches per step: a frame's micro_batch must be below it."""

    def reason_to_reject(self, header: FrameHeader) -> FrameError | None:
        """The first way ``header`` differs from this expectation, or None when it matches."""
        if header.assignment_version != self.assignment_version:
            return VersionMismatch(f"frame is for assignment version {header.assignment_version}, "
                                   f"this stage runs version {self.assignment_version}")
        kinds = (self.kind,) if isinstance(self.kind, str) else self.kind
        if header.kind not in kinds:
            return FrameError(f"frame has kind {header.kind}, expected {' or '.join(kinds)}")
        if header.delta and (self.delta_codec is None or header.kind == "held-out"):
            return FrameError(f"frame is a {header.kind} delta, but this plan sends {header.kind} whole")
        mismatches = [
            ("step", header.step, self.step),
            ("pipeline", header.pipeline, self.pipeline),
            ("shape", header.shape, list(self.shape)),
            ("codec", header.codec, self.delta_codec if header.delta else self.codec),
        ]
        for name, got, wanted in mismatches:
            if wanted is not None and got != wanted:
                return FrameError(f"frame has {name} {got}, expected {wanted}")
        if self.micro_batches is not None and header.micro_batch >= self.micro_batches:
            return FrameError(f"frame has micro_batch {header.micro_batch}, but a step has {self.micro_batches}")
        return None


def encode_frame(
    header: FrameHeader, tensor: torch.Tensor | runtime_pb2.Tensor, *, part_size_bytes: int = FRAME_PART_BYTES
) -> list[runtime_pb2.ExpertRequest]:
    """The messages that carry ``tensor`` in the header's codec; the tensor may live on any device, or be encoded
    in that codec already (an activation delta, whose sender stages what the message decodes to)."""
    encoded = isinstance(tensor, runtime_pb2.Tensor)
    shape = list(tensor.size) if encoded else list(tensor.shape)
    if header.shape != shape:
        raise ValueError(f"header says shape {header.shape}, tensor is {shape}")
    serialized = tensor if encoded else encode_tensor(tensor, header.codec)
    parts = list(split_for_streaming(serialized, part_size_bytes))
    first = runtime_pb2.ExpertRequest(metadata=header.json().encode(), tensors=parts[:1])
    return [first, *(runtime_pb2.ExpertRequest(tensors=[part]) for part in parts[1:])]


class _FrameReader:
    """Checks a frame message by message, so a bad or oversized frame is refused before the rest is read."""

    def __init__(self, expected: Expectation, max_frame_bytes: int) -> None:
        self.expected, self.max_frame_bytes = expected, max_frame_bytes
        self.header: FrameHeader | None = None
        self.parts: list[runtime_pb2.Tensor] = []
        self.frame_bytes = 0
        self.tensor_bytes = 0

    def feed(self, message: runtime_pb2.ExpertRequest) -> None:
        self.frame_bytes += message.ByteSize()
        if self.frame_bytes > self.max_frame_bytes:
            raise FrameError(f"frame exceeds {self.max_frame_bytes} bytes; stopped reading")
        if self.header is None:
            self.header = self._parse_header(message.metadata)
        elif message.metadata:
            raise FrameError("a message after the first carries a header")
        if len(message.tensors) != 1:
            raise FrameError(f"a frame message carries {len(message.tensors)} tensor parts instead of one")
        part = message.tensors[0]
        if self.parts and (part.dtype or part.size or not part.buffer):
            raise FrameError("a message after the first starts a new tensor or carries no bytes")
        self.parts.append(part)
        if len(self.parts) > self._announced_parts():
            raise FrameError(f"frame tensor came in more parts than the {self._announced_parts()} it announced")
        self.tensor_bytes += len(part.buffer)
        if self.tensor_bytes > self._max_tensor_bytes():
            raise FrameError(f"frame carries over {self._max_tensor_bytes()} tensor bytes, "
                             f"more than {self.header.codec} {self.header.shape} needs; stopped reading")

    def _parse_header(self, metadata: bytes) -> FrameHeader:
        if not metadata:
            raise FrameError("the first message of a frame carries no header")
        if len(metadata) > MAX_FRAME_HEADER_BYTES:
            raise FrameError(f"frame header of {len(metadata)} bytes is over {MAX_FRAME_HEADER_BYTES} bytes")
        try:
            header = FrameHeader.parse_raw(metadata)
        except ValidationError as e:
            problems = "; ".join(f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors())
            raise FrameError(f"malformed frame header: {problems}") from None
        if reason := self.expected.reason_to_reject(header):
            raise reason
        return header

    def _announced_parts(self) -> int:
        return max(self.parts[0].chunks, 1)  # hivemind announces 0 chunks for an empty tensor, sent in one part

    def _max_tensor_bytes(self) -> int:
        return wire_bytes(self.header.codec, math.prod(self.header.shape))

    def finish(self) -> tuple[FrameHeader, torch.Tensor]:
        if self.header is None:
            raise FrameError("the stream ended before a frame began")
        first, codec = self.parts[0], self.header.codec
        compression, dtype = COMPRESSION_TYPES[codec], wire_dtype_name(codec)
        if first.compression != compression:
            raise FrameError(f"frame tensor uses {runtime_pb2.CompressionType.Name(first.compression)}, its header's "
                             f"codec {codec} is sent as {runtime_pb2.CompressionType.Name(compression)}")
        if first.dtype != dtype or list(first.size) != self.header.shape:
            raise FrameError(f"frame tensor is {first.dtype} {list(first.size)}, "
                             f"its header says {codec} {self.header.shape} ({dtype})")
        if len(self.parts) != self._announced_parts():
            raise FrameError(f"frame tensor came in {len(self.parts)} parts, "
                             f"its first part announced {self._announced_parts()}")
        if self.tensor_bytes != self._max_tensor_bytes():
            raise FrameError(f"frame carries {self.tensor_bytes} tensor bytes; {codec} {self.header.shape} "
                             f"needs {self._max_tensor_bytes()}")
        tensor = decode_tensor(combine_from_streaming(self.parts), codec)
        if not torch.isfinite(tensor).all():
            bad = int((~torch.isfinite(tensor)).sum())
            raise FrameError(f"frame carries {bad} NaN or infinite values of {tensor.numel()}")
        return self.header, tensor


def decode_frame(
    messages: Iterable[runtime_pb2.ExpertRequest], *, expected: Expectation, max_frame_bytes: int = MAX_FRAME_BYTES
) -> tuple[FrameHeader, torch.Tensor]:
    """The header and the CPU tensor of a frame whose messages are at hand.

    Raises:
        FrameError: the frame is malformed, oversized or not what ``expected`` says (VersionMismatch for a frame
            of another assignment version).
    """
    reader = _FrameReader(expected, max_frame_bytes)
    for message in messages:
        reader.feed(message)
    return reader.finish()


async def read_frame(
    stream: AsyncIterator[runtime_pb2.ExpertRequest], *, expected: Expectation, max_frame_bytes: int = MAX_FRAME_BYTES
) -> tuple[FrameHeader, torch.Tensor]:
    """``decode_frame`` for a stream handler: reads messages as they arrive and stops at the first bad one.

    The caller bounds the wait (``asyncio.timeout``); a peer that stalls is not this function's to judge.
    """
    reader = _FrameReader(expected, max_frame_bytes)
    async for message in stream:
        reader.feed(message)
    return reader.finish()
