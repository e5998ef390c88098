"""Activations forward and gradients backward between the neighbouring stages of one pipeline.

Each frame travels as one stream call (``ActivationServicer.rpc_push``) and is answered once: an empty answer
when the receiver took it, the receiver's reason when it refused it. A receiver takes activations (and the
held-out ones of an evaluation) only from the previous stage of its pipeline and gradients only from the next, for
its own assignment version, pipeline and tensor shape, and for the current step or the one after it (a neighbour
that finished its all-reduce first may already be one step ahead; two steps ahead is impossible in lock-step, so
anything further is refused). Good frames wait in an ``Inbox`` until the worker takes them; a bad one is logged,
answered with its reason, and the servicer keeps serving.

Frames are keyed by (kind, step, attempt, micro-batch): a step that failed anywhere is retried under attempt + 1
(client/training/step_commit.py), and frames of an older attempt than the receiver's are refused. A frame that
arrives twice (the sender retried a call whose answer it lost) is taken once and the repeat answered as a
success when it is identical, so a retried send is idempotent.

A send whose outcome is unknown is retried with the same frame. This is what happens on hivemind's
``ValueError: asingle() expected ... an empty iterable`` (docs/hivemind.md, pitfall 13): the stream to the
receiver closed with no answer, which hivemind's ``_add_protobuf_stream_handler`` also produces when its request
reader hits end of stream and cancels a handler that has already taken the frame. The call may or may not have
delivered, so the frame is sent again (a repeat is a no-op at the receiver); if the retries run out, the step's
commit vote fails and the whole plan retries the step (never a one-sided skip).

With activation deltas in the plan (AQ-SGD, client/training/activation_deltas.py), each link keeps the last
activation of every sample at both ends: the sender sends a sample's change once it has sent it whole, the receiver
adds it to its copy, and both take the new copies when the step commits (``NeighbourStreams.commit``).
"""
import asyncio
import contextlib
import hashlib
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import (
    AsyncIterator,  # ServicerBase recognises stream arguments by typing.AsyncIterator only
    Literal,
)

import torch
from hivemind.p2p import P2P, P2PContext, PeerID, ServicerBase
from hivemind.proto import runtime_pb2
from hivemind.utils.asyncio import as_aiter

from hetswarm.client.peer.served import Served
from hetswarm.client.training.activation_deltas import RESEND_WHOLE, DeltaBase, DeltaBuffers, Sample
from hetswarm.client.training.errors import FrameRefused, NeighbourSilent, StageError, dial_failed
from hetswarm.protocol.codecs import encode_tensor
from hetswarm.protocol.framing import Expectation, FrameError, FrameHeader, FrameKind, encode_frame, read_frame
from hetswarm.protocol.limits import MAX_FRAME_BYTES
from hetswarm.protocol.wire_format import ROUNDED_AT_RANDOM, Codec, WireFormat

__all__ = ["ActivationServicer", "LinkObserver", "NeighbourStreams", "StreamPlan", "send_frame"]

logger = logging.getLogger(__name__)

Ping = Literal["answered", "late", "failed"]

LinkObserver = Callable[[str, int, float], None]
"""Told of each frame delivered: the peer it went to, its bytes on the wire, the seconds until its answer."""

FrameKey = tuple[FrameKind, int, int, int]
"""(kind, step, attempt, micro_batch); the pipeline is fixed per receiver, so it is checked rather than keyed."""

_STEPS_AHEAD = 1
_PING_RETRY_S = 0.5
_SEND_TRIES = 3
"""Sends of one frame whose outcome is unknown (the answer was lost), before the send counts as failed."""
_SEND_RETRY_PAUSE_S = 0.05


@dataclass(frozen=True, kw_only=True, slots=True)
class StreamPlan:
    """What one stage accepts from its neighbours, taken from its assignment."""

    assignment_version: int
    pipeline: int
    stage: int
    micro_batches: int
    shape: tuple[int, ...]
    """(micro_batch_size, seq_len, d_model): activations and their gradients have the same shape."""
    wire: WireFormat
    """The plan's codecs; both ends of a hop send and expect the same."""
    previous: PeerID | None
    next: PeerID | None
    data_period: int | None = None
    """The data order repeats every this many steps (ModelConfig.data_period); activation deltas need it."""

    def codec(self, kind: FrameKind, neighbour: PeerID | None) -> Codec:
        """The codec of a whole frame of `kind` on the hop with `neighbour` (the plan may choose one per hop)."""
        hop = self.stage - 1 if neighbour == self.previous else self.stage
        return self.wire.hop_codec(kind, hop, self.pipeline)

    def delta_codec(self, kind: FrameKind) -> Codec | None:
        """The codec of a delta frame of `kind`; None when the plan sends `kind` whole."""
        return self.wire.activation_deltas if kind == "activations" and self.data_period else None

    def sample(self, step: int, micro_batch: int) -> Sample:
        """Which sample a step's micro-batch is: the same every data_period steps."""
        return step % self.data_period, micro_batch

    def whole_frame(self, kind: FrameKind, tensor: torch.Tensor, codec: Codec, *, step: int, micro_batch: int
                    ) -> torch.Tensor | runtime_pb2.Tensor:
        """What encode_frame sends for a whole frame: gradients in a codec of ROUNDED_AT_RANDOM encoded here, rounded
        at random by the frame's place in the run and nothing else (not the attempt), so that a retried step, and a
        run that equals this one, send the same bytes; any other tensor as it is, for encode_frame to encode."""
        if kind != "gradients" or codec not in ROUNDED_AT_RANDOM:
            return tensor
        place = f"{self.stage}/{self.pipeline}/{step}/{micro_batch}".encode()
        seed = int.from_bytes(hashlib.blake2b(place, digest_size=8).digest(), "little") >> 1  # torch takes 63 bits
        return encode_tensor(tensor, codec, rounding_seed=seed)

    def delta_buffers(self, neighbour: PeerID | None) -> DeltaBuffers | None:
        """One end of the activation link with `neighbour`, when the plan sends deltas and there is a neighbour."""
        delta = self.delta_codec("activations")
        return DeltaBuffers(whole=self.codec("activations", neighbour), delta=delta) if delta and neighbour else None


class Inbox:
    """Frames that arrived before or while the worker waits for them, one future per key."""

    def __init__(self) -> None:
        self._frames: dict[FrameKey, asyncio.Future] = {}
        self._taken: dict[FrameKey, torch.Tensor] = {}
        """Frames the worker already took, kept until their step is dropped, so a repeat is recognised."""

    def _slot(self, key: FrameKey) -> asyncio.Future:
        return self._frames.setdefault(key, asyncio.get_running_loop().create_future())

    def put(self, key: FrameKey, tensor: torch.Tensor) -> str | None:
        """Stores a frame; a repeat of an identical frame is a no-op. Returns a reason to refuse a different frame
        under a key that is already filled."""
        slot = self._frames.get(key)
        earlier = self._taken.get(key, slot.result() if slot is not None and slot.done() else None)
        if earlier is not None:
            if earlier.shape == tensor.shape and earlier.dtype == tensor.dtype and torch.equal(earlier, tensor):
                logger.debug(f"Repeat of {key} taken as delivered")
                return None
            return f"duplicate {key[0]} frame for step {key[1]}, attempt {key[2]}, micro-batch {key[3]}"
        self._slot(key).set_result(tensor)
        return None

    async def take(self, key: FrameKey, timeout_s: float, *, unless: FrameKey | None = None) -> torch.Tensor | None:
        """The frame under ``key``, waiting up to ``timeout_s`` for it (TimeoutError otherwise); None when a frame
        under ``unless`` arrives first (its sender has moved past ``key``)."""
        wanted = self._slot(key)
        async with asyncio.timeout(timeout_s):  # asyncio.wait leaves the slots alone when the time is up
            await asyncio.wait({wanted} if unless is None else {wanted, self._slot(unless)},
                               return_when=asyncio.FIRST_COMPLETED)
        if not wanted.done():
            return None
        tensor = wanted.result()  # CancelledError when drop_before dropped the key meanwhile
        del self._frames[key]
        self._taken[key] = tensor
        return tensor

    def drop_before(self, step: int, attempt: int = 0) -> None:
        """Forgets frames of steps and attempts before (step, attempt), so a stale neighbour cannot fill memory
        and an aborted attempt's frames are never used."""
        for key in [key for key in self._frames if (key[1], key[2]) < (step, attempt)]:
            self._frames.pop(key).cancel()
        for key in [key for key in self._taken if (key[1], key[2]) < (step, attempt)]:
            del self._taken[key]


class ActivationServicer(ServicerBase):
    """Receives frames from the two neighbours of this stage; namespaced per swarm."""

    def __init__(self, plan: StreamPlan, *, frame_timeout_s: float) -> None:
        self.plan, self.frame_timeout_s = plan, frame_timeout_s
        self.inbox = Inbox()
        self.deltas = plan.delta_buffers(plan.previous)
        """The receiving end of the activation link from the previous stage, when the plan sends deltas."""
        self.current_step = 0
        self.current_attempt = 0

    async def rpc_ping(self, request: runtime_pb2.ExpertRequest, context: P2PContext) -> runtime_pb2.ExpertResponse:
        """Answers once this stage's handlers are up, so peers start a step only when everyone can hear them."""
        return runtime_pb2.ExpertResponse()

    async def rpc_push(
        self, stream: AsyncIterator[runtime_pb2.ExpertRequest], context: P2PContext
    ) -> runtime_pb2.ExpertResponse:
        """Takes one frame into the inbox, or answers why not (a verdict, never a crash, on a peer's bad input).

        A neighbour's refused frame is drained, so that it reads our verdict; a stranger is cut off at once: it
        gets no verdict and costs us no more bytes."""
        kinds = self._kind_of(context.remote_id)
        if kinds is None:
            logger.warning(f"Cut off a frame stream from {context.remote_id}: not a neighbour of this stage in "
                           f"pipeline {self.plan.pipeline}")
            return runtime_pb2.ExpertResponse(metadata=b"not a neighbour of this stage")
        reason = await self._take(stream, kinds, context.remote_id)
        if reason is None:
            return runtime_pb2.ExpertResponse()
        logger.warning(f"Refused a frame from {context.remote_id}: {reason}")
        await self._drain(stream)
        return runtime_pb2.ExpertResponse(metadata=reason.encode())

    def _kind_of(self, sender: PeerID) -> tuple[FrameKind, ...] | None:
        """What a sender may push to this stage: activations (and held-out ones) from the previous stage, gradients
        from the next."""
        return {self.plan.previous: ("activations", "held-out"), self.plan.next: ("gradients",)}.get(sender)

    async def _drain(self, stream: AsyncIterator[runtime_pb2.ExpertRequest]) -> None:
        """Reads what the sender is still writing (bounded), so it gets our verdict rather than a reset stream."""
        received = 0
        with contextlib.suppress(Exception):  # a peer that breaks off or stalls here costs nothing more
            async with asyncio.timeout(self.frame_timeout_s):
                async for message in stream:
                    received += message.ByteSize()
                    if received > MAX_FRAME_BYTES:
                        return

    async def _take(self, stream: AsyncIterator[runtime_pb2.ExpertRequest], kinds: tuple[FrameKind, ...],
                    sender: PeerID) -> str | None:
        """Reads and stores one frame of a neighbour; returns why it was refused, or None when it was taken."""
        expected = Expectation(kind=kinds, assignment_version=self.plan.assignment_version, shape=self.plan.shape,
                               codec=self.plan.codec(kinds[0], sender), delta_codec=self.plan.delta_codec(kinds[0]),
                               pipeline=self.plan.pipeline,
                               micro_batches=self.plan.micro_batches)
        try:
            async with asyncio.timeout(self.frame_timeout_s):
                header, tensor = await read_frame(stream, expected=expected)
        except FrameError as e:
            return str(e)
        except TimeoutError:
            return f"frame not received within {self.frame_timeout_s} s"
        if not self.current_step <= header.step <= self.current_step + _STEPS_AHEAD:
            return f"frame is for step {header.step}, this stage is at step {self.current_step}"
        if (header.step, header.attempt) < (self.current_step, self.current_attempt):
            return (f"frame is for attempt {header.attempt} of step {header.step}, this stage is at attempt "
                    f"{self.current_attempt}")
        if self.deltas is None or header.kind != "activations":
            return self.inbox.put((header.kind, header.step, header.attempt, header.micro_batch), tensor)
        sample, attempt = self.plan.sample(header.step, header.micro_batch), (header.step, header.attempt)
        try:
            tensor = self.deltas.incoming(tensor, attempt=attempt, sample=sample, base_crc=header.base_crc,
                                          sender=self.plan.previous)
        except DeltaBase as e:
            return str(e)
        refusal = self.inbox.put((header.kind, header.step, header.attempt, header.micro_batch), tensor)
        if refusal is None:
            self.deltas.stage(attempt, sample, tensor)
        return refusal


async def send_frame(
    p2p: P2P, peer: PeerID, header: FrameHeader, tensor: torch.Tensor | runtime_pb2.Tensor, *, namespace: str,
    timeout_s: float, stub=None,
) -> tuple[int, float]:
    """Delivers one frame to ``peer``'s ActivationServicer (``tensor`` as encode_frame takes it), sending it again
    while the outcome is unknown. Returns the bytes on the wire and the seconds the delivering try took until the
    answer: what the link carried (client/peer/link_probe.py, `carried`).

    Raises:
        FrameRefused: the peer refused the frame (its reason is in the message), could not be reached, did not
            answer in time, or the outcome stayed unknown after a few tries.
    """
    what = f"{header.kind} of step {header.step} (attempt {header.attempt}), micro-batch {header.micro_batch}"
    stub = stub or ActivationServicer.get_stub(p2p, peer, namespace=namespace)
    messages = encode_frame(header, tensor)
    for tried in range(1, _SEND_TRIES + 1):
        started = time.perf_counter()
        try:
            response = await stub.rpc_push(as_aiter(*messages), timeout=timeout_s)
        except TimeoutError:
            # slow, not gone
            raise FrameRefused(f"{peer} did not take {what} within {timeout_s} s", cause=peer) from None
        except ValueError as e:  # hivemind's asingle(): the stream closed with no answer; delivered or not
            logger.debug(f"Outcome of sending {what} to {peer} unknown (try {tried}): {e}", exc_info=True)
            if tried == _SEND_TRIES:
                raise FrameRefused(f"outcome of sending {what} to {peer} still unknown after {tried} tries: "
                                   f"{e!r}", cause=peer) from e
            await asyncio.sleep(_SEND_RETRY_PAUSE_S)
            continue
        except Exception as e:  # P2PDaemonError, P2PHandlerError, a broken connection: the peer is unreachable
            gone = [peer] if dial_failed(e) else []  # only a failed dial says the peer is gone
            raise FrameRefused(f"could not deliver {what} to {peer}: {e!r}", peers=gone, cause=peer) from e
        if response.metadata:
            verdict = response.metadata.decode(errors="replace")
            raise FrameRefused(f"{peer} refused {what}: {verdict}", cause=peer, verdict=verdict)
        return sum(message.ByteSize() for message in messages), time.perf_counter() - started


class NeighbourStreams(Served):
    """The worker's side of its two pipeline links: send to a neighbour, take what the neighbours sent."""

    def __init__(self, p2p: P2P, plan: StreamPlan, *, namespace: str, frame_timeout_s: float,
                 on_sent: LinkObserver | None = None) -> None:
        """`on_sent` hears of every frame delivered: the neighbour's id, its bytes and seconds (`send_frame`)."""
        self.p2p, self.plan, self.namespace, self.frame_timeout_s = p2p, plan, namespace, frame_timeout_s
        self.on_sent = on_sent
        self.servicer = ActivationServicer(plan, frame_timeout_s=frame_timeout_s)
        self.deltas = plan.delta_buffers(plan.next)
        """The sending end of the activation link to the next stage, when the plan sends deltas."""

    @property
    def handlers(self) -> ActivationServicer:
        return self.servicer

    def advance_to(self, step: int, attempt: int = 0) -> None:
        """Moves the accepted window to [(step, attempt), step + 1] and forgets frames of earlier steps and
        attempts."""
        self.servicer.current_step, self.servicer.current_attempt = step, attempt
        self.servicer.inbox.drop_before(step, attempt)

    async def send(self, kind: FrameKind, tensor: torch.Tensor, *, step: int, micro_batch: int,
                   attempt: int = 0) -> None:
        """Activations to the next stage or gradients to the previous one, in the plan's codec for that hop."""
        peer = self.plan.previous if kind == "gradients" else self.plan.next
        if peer is None:
            raise ValueError(f"this stage has no neighbour to send {kind} to")
        tensor, codec, base_crc = tensor.detach(), self.plan.codec(kind, peer), None
        sample = self.plan.sample(step, micro_batch) if self.deltas is not None and kind == "activations" else None
        if sample is not None:
            sent, codec, base_crc = self.deltas.outgoing(tensor.to("cpu", torch.float32), attempt=(step, attempt),
                                                         sample=sample)
        else:
            sent = self.plan.whole_frame(kind, tensor, codec, step=step, micro_batch=micro_batch)
        header = FrameHeader.for_tensor(tensor, kind=kind, codec=codec, assignment_version=self.plan.assignment_version,
                                        step=step, attempt=attempt, micro_batch=micro_batch,
                                        pipeline=self.plan.pipeline, base_crc=base_crc)
        try:
            n_bytes, seconds = await send_frame(self.p2p, peer, header, sent, namespace=self.namespace,
                                                timeout_s=self.frame_timeout_s, stub=self._stub(peer, header))
        except FrameRefused as e:
            if base_crc is not None and e.verdict is not None and e.verdict.endswith(RESEND_WHOLE):
                self.deltas.forget(sample)  # the receiver's copy differs: the step's retry sends it whole
            raise
        if self.on_sent is not None:
            try:
                self.on_sent(peer.to_base58(), n_bytes, seconds)
            except Exception as e:  # a measurement must never cost a step
                logger.debug(f"Could not take the frame to {peer} as a link measurement: {e!r}", exc_info=True)

    def commit(self, step: int, attempt: int) -> None:
        """The plan committed (step, attempt): the activation copies it made at both links take effect."""
        for deltas in (self.deltas, self.servicer.deltas):
            if deltas is not None:
                deltas.commit((step, attempt))

    def _stub(self, peer: PeerID, header: FrameHeader):
        """The stub a frame goes through (tests put a faulty one here)."""
        return ActivationServicer.get_stub(self.p2p, peer, namespace=self.namespace)

    async def receive(self, kind: FrameKind, *, step: int, micro_batch: int, attempt: int = 0) -> torch.Tensor:
        """The frame a neighbour sent for this step and micro-batch (a CPU tensor, decoded from the plan's codec).

        A held-out frame is given up on as soon as the previous stage's first activations of the next step arrive:
        it has moved on without sending it (its evaluation failed), and this stage must not hold up that step.

        Raises:
            NeighbourSilent: it did not arrive within the frame timeout, or its sender moved on; either names the
                sender as its cause, never as unreachable (the class says why).
        """
        sender = self.plan.next if kind == "gradients" else self.plan.previous
        moved_on = ("activations", step + 1, 0, 0) if kind == "held-out" else None
        try:
            tensor = await self.servicer.inbox.take((kind, step, attempt, micro_batch), self.frame_timeout_s,
                                                    unless=moved_on)
        except TimeoutError:
            raise NeighbourSilent(f"no {kind} of step {step} (attempt {attempt}), micro-batch {micro_batch} from {sender} "
                                  f"within {self.frame_timeout_s} s", cause=sender) from None
        if tensor is None:
            raise NeighbourSilent(f"{sender} moved on to step {step + 1} without sending {kind} of step {step}, "
                                  f"micro-batch {micro_batch}", cause=sender)
        return tensor

    async def wait_for(self, peers: Iterable[PeerID], timeout_s: float) -> None:
        """Returns once every peer's stage handlers answer, so the first step does not race their start-up.

        Raises:
            StageError: some peers did not answer within ``timeout_s``; they are named.
        """
        waiting = set(peers) - {self.p2p.peer_id}
        deadline = time.monotonic() + timeout_s
        while waiting:
            for peer in list(waiting):
                if await self.ping(peer, timeout_s=_PING_RETRY_S * 4) == "answered":
                    waiting.discard(peer)
            if waiting and time.monotonic() > deadline:
                raise StageError(f"peers {', '.join(map(str, sorted(waiting, key=str)))} did not come up "
                                 f"within {timeout_s} s")
            if waiting:
                await asyncio.sleep(_PING_RETRY_S)

    async def ping(self, peer: PeerID, *, timeout_s: float | None) -> Ping:
        """`answered`; `failed` when no connection to the peer's daemon could be made (it refused, or is gone);
        otherwise `late`, which proves nothing: the deadline passed first (a busy peer, or a ping queued behind bulk
        data on a slow link), or the daemon answered but the handler did not (a peer switching plans). With no
        deadline (None) the call is never cancelled; it ends when the daemon answers or gives up."""
        stub = ActivationServicer.get_stub(self.p2p, peer, namespace=self.namespace)
        try:
            await stub.rpc_ping(runtime_pb2.ExpertRequest(), timeout=timeout_s)
            return "answered"
        except TimeoutError:
            return "late"
        except Exception as e:
            logger.debug(f"{peer} does not answer a ping: {e!r}")
            return "failed" if dial_failed(e) else "late"  # a handler between plans proves nothing
