"""The runner of one all-reduce round of a stage group: every member ends with the same bits, and trusts no peer.

Every member must end with the very same bits, or replicas drift apart by rounding (a replica's state hash would
then never match its partner's). hivemind's runner hands each sender ``average - part`` and the sender adds it
back, which is not bit-exact; ``ExactAllReduceRunner`` sends the reducer's average itself, for remote and local
parts alike, so every member copies identical values (it replaces three of the steps of hivemind 1.1.12's runner,
opened as hooks in client/peer/hivemind_compat/allreduce.py).

Parts travel in the plan's all-reduce codec (protocol/codecs.py) both ways. A reducer encodes each average once and
every member, the reducer included, uses the decoded values, so replicas stay bit-identical. When the codec loses
precision, each member keeps what its parts lost and each reducer what its averages lost, and adds it to the next
step's (client/training/error_feedback.py).

Nor does a member take a reducer's word for its averages: one that is not finite, or far longer than any honest
reduction of the part it was sent (client/training/part_bounds.py), fails the round, and the reducer is
named in the ``PartialAllReduce`` as a banned sender is, so that no replica applies the average and the plan can
leave that member out. An average within those bounds is checked too: senders sign the digests of the parts they send
each reducer, and every member re-reduces one part of each other reducer's share before it applies a round
(client/training/reduction_audit.py).
"""
import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import AsyncIterator  # the hooks' streams, as hivemind's ServicerBase spells them

import torch
from hivemind.averaging.partition import AllreduceException, BannedException, TensorPartReducer
from hivemind.compression import CompressionBase, CompressionInfo
from hivemind.p2p import PeerID
from hivemind.proto import averaging_pb2, runtime_pb2
from hivemind.utils.asyncio import aiter_with_timeout
from hivemind.utils.crypto import RSAPrivateKey

from hetswarm.client.peer.hivemind_compat import HookedAllReduceRunner
from hetswarm.client.training.error_feedback import ErrorFeedback
from hetswarm.client.training.part_bounds import MAX_PART_NORM_RATIO, PartBounds
from hetswarm.client.training.reduction_audit import StatedParts, audit_reducer, audit_targets
from hetswarm.client.training.robust_aggregation import centered_clip
from hetswarm.protocol.codecs import allreduce_compression, decode_tensor
from hetswarm.protocol.keys import AttemptKey
from hetswarm.protocol.part_statements import part_digest, signed_statement
from hetswarm.protocol.records import Aggregation
from hetswarm.protocol.wire_format import Codec

__all__ = ["ExactAllReduceRunner", "RecordingCompression", "exact_mean"]

logger = logging.getLogger(__name__)

class _Kept:
    """Stands in for TensorPartReducer's running sum of one part: keeps each sender's version, and aggregates them
    all at once when the reducer divides by the total weight (hivemind/averaging/partition.py)."""

    def __init__(self, aggregate: Callable[[list[torch.Tensor]], torch.Tensor]) -> None:
        self.parts: list[torch.Tensor] = []
        self.aggregate = aggregate

    def add_(self, tensor: torch.Tensor, alpha: float = 1.0) -> "_Kept":
        self.parts.append(tensor)
        return self

    def div_(self, denominator: float) -> torch.Tensor:
        return self.aggregate(self.parts)


def exact_mean(parts: list[torch.Tensor]) -> torch.Tensor:
    """The mean of the parts, the same bits whatever order they arrived in: each value's terms are summed in sorted
    order, in float64. (hivemind's reducer adds parts as they arrive, so two runs of one round may differ in the last
    bit, and a lossy codec can turn that bit into a whole quantization level.)"""
    stacked = torch.stack(parts).double()
    if len(parts) > 2:  # two terms add up to the same bits in either order: only more need sorting
        stacked = stacked.sort(dim=0).values
    return stacked.sum(dim=0).div(len(parts)).float()


class _KeepingReducer(TensorPartReducer):
    """A TensorPartReducer that keeps every sender's part and aggregates them at once with `aggregate`."""

    def __init__(self, part_shapes, num_senders: int, aggregate: Callable[[list[torch.Tensor]], torch.Tensor]):
        self._aggregate = aggregate  # before super().__init__, which prepares the first part
        super().__init__(part_shapes, num_senders)

    def reset_accumulators(self) -> None:
        super().reset_accumulators()
        if not self.finished.is_set():
            self.accumulator = _Kept(self._aggregate)


class RecordingCompression(CompressionBase):
    """A member's compression of the parts it sends: keeps, in `errors`, what each part lost on the way."""

    def __init__(self, base: CompressionBase, errors: Sequence[torch.Tensor]) -> None:
        self.base, self.errors = base, errors
        self.compression_type = base.compression_type

    def compress(self, tensor: torch.Tensor, info: CompressionInfo, allow_inplace: bool = False) -> runtime_pb2.Tensor:
        serialized = self.base.compress(tensor, info)
        start = info.part_index * info.part_size  # parts are consecutive slices of flattened tensor `info.key`
        self.errors[info.key].view(-1)[start:start + tensor.numel()] = (
            tensor.reshape(-1) - self.base.extract(serialized).reshape(-1))
        return serialized

    def extract(self, serialized_tensor: runtime_pb2.Tensor) -> torch.Tensor:
        return self.base.extract(serialized_tensor)

    def estimate_compression_ratio(self, info: CompressionInfo) -> float:
        return self.base.estimate_compression_ratio(info)


class ExactAllReduceRunner(HookedAllReduceRunner):
    """An AllReduceRunner whose outputs are the reducers' averages themselves, not deltas to the local tensors.

    It also trusts no sender: every part counts with the same weight whatever weight its message claims (hivemind
    takes the sender's word), and a part beyond the round's bounds (client/training/part_bounds.py) bans its sender:
    the round is partial and names it (``StageGroup.average``) instead of poisoning every replica's average.

    Each reducer keeps the members' parts and aggregates them at once: with `exact_mean`, whose bits do not depend
    on the order the parts arrived in, or with ``aggregation="centered_clip"``, CenteredClip
    (client/training/robust_aggregation.py): for open swarms, where a member may send values within those bounds
    that are still wrong.

    Parts come and go in ``codec``; a part in another compression bans its sender. Each average is encoded once,
    plus its residual from the last step when ``feedback`` is given, and the decoded values are what this member
    keeps too.
    """

    def __init__(self, *args, aggregation: Aggregation = "mean", codec: Codec = "fp32",
                 feedback: ErrorFeedback | None = None, feedback_round: AttemptKey = (0, 0),
                 part_norm_ratio: float | None = MAX_PART_NORM_RATIO, private_key: RSAPrivateKey | None = None,
                 **kwargs) -> None:
        """
        Args:
            private_key: this member's identity, which signs the statements of the parts it sends; with it, in fp32,
                senders' statements are required and the reducers are audited (reduction_audit.py).
        """
        self.codec, self.feedback, self.feedback_round = codec, feedback, feedback_round
        self.private_key = private_key if codec == "fp32" else None
        self.audited: dict[int, torch.Tensor] = {}
        """Reducer index → its average of the part of its share this member audits ..."""
        self.audits: dict[int, asyncio.Task] = {}
        """... and the audit, started as soon as that average is here (reduction_audit.audit_reducer)."""
        self._part_sent: dict[int, asyncio.Event] = {}
        self.wire_compression = allreduce_compression(codec)
        self.sent: dict[int, runtime_pb2.Tensor] = {}
        """Each average of this reducer's parts as sent."""
        self._decoded: dict[int, torch.Tensor] = {}
        """... and as every member decodes it."""
        self.answered = asyncio.Event()
        """Set once `sent` holds every part this member reduces."""
        self.reducer_failures: dict[PeerID, str] = {}
        """Why each reducer whose averages we lack failed us: hivemind only counts the values it lost."""
        self.bad_reducers: dict[PeerID, str] = {}
        """Reducers whose averages no honest reduction gives (`bounds`): named, not merely lost."""
        super().__init__(*args, **kwargs)
        reducer = self.tensor_part_reducer
        reducer.finished.set()  # unused: its finalizer would warn that it received none of its parts
        self.aggregate = centered_clip if aggregation == "centered_clip" else exact_mean
        self.tensor_part_reducer = _KeepingReducer(reducer.part_shapes, reducer.num_senders, self.aggregate)
        sent = self.sent_parts
        self.stated = None if self.private_key is None else StatedParts(
            group_id=self.group_id, senders=self.sender_peer_ids, reducer=self.peer_id.to_base58(),
            parts=self.tensor_part_reducer.num_parts)
        """Each sender's statement and parts, where statements are required (a private key, fp32)."""
        self.bounds = PartBounds(sent, own_index=self.ordered_peer_ids.index(self.peer_id), ratio=part_norm_ratio)
        """What a sender's part and a reducer's average may be (client/training/part_bounds.py)."""
        self.own_parts = [] if self.private_key is None else [part.clone() for part in self.parts_for_local_averaging]
        """This reducer's own parts, as they were before the round wrote averages over them: to show an auditor."""
        self.audit_targets = {} if self.private_key is None else audit_targets(
            list(self.tensor_part_container.num_parts_by_peer), self.ordered_peer_ids.index(self.peer_id))
        """Reducer index → the part of its share this member checks (reduction_audit.py)."""
        self.audited_parts = {peer: sent[peer][part][0].clone() for peer, part in self.audit_targets.items()}
        """Reducer index → what this member sent it for that part: the auditor needs not ask for its own part."""
        self._my_statements = {} if self.private_key is None else {
            peer: asyncio.create_task(asyncio.to_thread(self._statement_for, peer, [part for part, _ in sent[peer]]))
            for peer, reducer in enumerate(self.ordered_peer_ids) if reducer != self.peer_id and sent[peer]}
        """Reducer index → this member's statement of the parts it sends it, made in a thread (hashing a large
        gradient takes a while, and hashlib lets other threads run meanwhile)."""

    def cancel_checks(self) -> None:
        """Cancels what is left of this round's statements and audits: a failed round's need not finish."""
        for task in [*self._my_statements.values(), *self.audits.values()]:
            task.cancel()

    def part_sent(self, part_index: int) -> asyncio.Event:
        """Set once this reducer has sent its average of part `part_index`: it may show an auditor its parts."""
        return self._part_sent.setdefault(part_index, asyncio.Event())

    def _outgoing_part(self, part_index: int, averaged: torch.Tensor) -> tuple[runtime_pb2.Tensor, torch.Tensor]:
        """The average of part `part_index` as sent to every member, and as every member decodes it."""
        if part_index not in self.sent:
            key = ("reduced", part_index)
            value = averaged if self.feedback is None else averaged + self.feedback.residual(key, averaged)
            serialized = self.wire_compression.compress(value, CompressionInfo.from_tensor(value))
            decoded = self.wire_compression.extract(serialized)
            if self.feedback is not None:
                self.feedback.record(self.feedback_round, key, value - decoded)
            self.sent[part_index], self._decoded[part_index] = serialized, decoded
            self.part_sent(part_index).set()
            if len(self.sent) == self.tensor_part_reducer.num_parts:
                self.answered.set()
        return self.sent[part_index], self._decoded[part_index]

    async def communicate_with(self, peer_id: PeerID) -> None:
        if peer_id != self.peer_id:
            return await self._communicate_with_reducer(peer_id)
        peer_index, sender_index = self.ordered_peer_ids.index(peer_id), self.sender_peer_ids.index(peer_id)
        for part_index, tensor_part in enumerate(self.parts_for_local_averaging):
            averaged_part = await self.tensor_part_reducer.accumulate_part(
                sender_index, part_index, tensor_part, weight=self.weight)
            decoded = self._outgoing_part(part_index, averaged_part)[1]
            self.tensor_part_container.register_processed_part(peer_index, part_index, decoded.clone())

    def _statement_for(self, peer_index: int, parts: list[torch.Tensor]) -> bytes:
        """This member's signed statement of `parts`, which it sends reducer `peer_index`: an fp32 part goes on the
        wire as its float32 bytes, so their digests are known before hivemind serializes a part."""
        return signed_statement(self.private_key, group_id=self.group_id,
                                reducer=self.ordered_peer_ids[peer_index].to_base58(),
                                digests=[part_digest(part.numpy().data) for part in parts])

    async def parts_for_reducer(self, peer_index: int) -> AsyncIterator[averaging_pb2.AveragingData]:
        """hivemind's stream of parts for a reducer, its first message carrying this member's signed statement of
        them all (protocol/part_statements.py) in its otherwise unused ``peer_id`` field."""
        async for message in super().parts_for_reducer(peer_index):
            if message.code == averaging_pb2.PART_FOR_AVERAGING and peer_index in self._my_statements:
                message.peer_id = await self._my_statements[peer_index]
            yield message

    async def _communicate_with_reducer(self, peer_id: PeerID) -> None:
        """hivemind's exchange with a remote reducer (every member reduces a share here, so none delays its
        results), with the averages decoded by protocol/codecs.py rather than hivemind's 8-bit decoder; a stream
        that ends short is asked again (module docstring)."""
        peer_index = self.ordered_peer_ids.index(peer_id)
        expected = self.tensor_part_container.num_parts_by_peer[peer_index]
        stub = self.peer_stub(peer_id)
        try:
            received = await self._receive_averages(
                peer_id, await stub.rpc_aggregate_part(self.parts_for_reducer(peer_index)), have=0)
            if received < expected:
                logger.debug(f"{peer_id} sent {received} of {expected} averages; asking again")
                received = await self._receive_averages(
                    peer_id, await stub.rpc_fetch_averages(averaging_pb2.AveragingData(group_id=self.group_id)),
                    have=received)
            if received != expected:
                raise AllreduceException(f"peer {peer_id} sent {received} parts, but we expected {expected}")
        except BaseException as e:
            if isinstance(e, Exception):
                logger.debug(f"Caught {e!r} when communicating to {peer_id}", exc_info=True)
            self.reducer_failures[peer_id] = repr(e)
            self.tensor_part_container.register_failed_reducer(peer_index)
            raise

    async def _receive_averages(self, peer_id: PeerID, stream: AsyncIterator[averaging_pb2.AveragingData], *,
                                have: int) -> int:
        """Registers the averages `stream` brings past the first `have`; returns how many it brought in all."""
        peer_index, part_index = self.ordered_peer_ids.index(peer_id), 0
        async for message in aiter_with_timeout(stream, self.reducer_timeout):
            if message.code != averaging_pb2.AVERAGED_PART:
                raise AllreduceException(f"{peer_id} sent {averaging_pb2.MessageCode.Name(message.code)}")
            if part_index == self.tensor_part_container.num_parts_by_peer[peer_index]:
                raise AllreduceException(f"{peer_id} sent more averages than it reduces parts")
            if part_index >= have:
                averaged = await asyncio.to_thread(decode_tensor, message.tensor_part, self.codec)
                if (refusal := self.bounds.average_refusal(averaged, peer_index, part_index)) is not None:
                    self.bad_reducers[peer_id] = f"an average with {refusal}"
                    raise AllreduceException(f"{peer_id} sent an average with {refusal}")
                if self.audit_targets.get(peer_index) == part_index:
                    self.audited[peer_index] = averaged
                    self.audits[peer_index] = asyncio.create_task(audit_reducer(self, peer_index, part_index))
                self.tensor_part_container.register_processed_part(peer_index, part_index, averaged)
            part_index += 1
        return part_index

    async def reduce_sender_parts(self, stream: AsyncIterator[averaging_pb2.AveragingData],
                                  sender_index: int) -> AsyncIterator[averaging_pb2.AveragingData]:
        part_index = 0
        try:
            async for message in stream:
                if message.tensor_part.compression != self.wire_compression.compression_type:
                    name = runtime_pb2.CompressionType.Name
                    logger.warning(f"{self.sender_peer_ids[sender_index]} sent a gradient part compressed as "
                                   f"{name(message.tensor_part.compression)}, the plan's {self.codec} is "
                                   f"{name(self.wire_compression.compression_type)}; leaving it out of the round")
                    break
                if self.stated is not None and (refusal := self.stated.refusal(
                        message, sender_index=sender_index, part_index=part_index)) is not None:
                    logger.warning(f"{self.sender_peer_ids[sender_index]} sent {refusal}; leaving it out of the round")
                    break
                tensor_part = decode_tensor(message.tensor_part, self.codec)
                if (refusal := self.bounds.part_refusal(tensor_part, part_index)) is not None:
                    logger.warning(f"{self.sender_peer_ids[sender_index]} sent a gradient part with {refusal}; "
                                   f"leaving it out of the round")
                    break
                try:
                    averaged_part = await self.tensor_part_reducer.accumulate_part(
                        sender_index, part_index, tensor_part, weight=self.weight)
                    part_index += 1
                except BannedException:
                    break  # sender was banned, we no longer need to aggregate it
                yield averaging_pb2.AveragingData(
                    code=averaging_pb2.AVERAGED_PART,
                    tensor_part=self._outgoing_part(part_index - 1, averaged_part)[0])
        finally:
            if part_index != self.tensor_part_reducer.num_parts:
                await self.ban_sender(self.sender_peer_ids[sender_index])
