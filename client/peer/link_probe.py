"""Link measurements between peers: RTT by small unary pings, bandwidth by timing a streamed payload.

Published as one-way latency = RTT / 2 and Mbit/s. Both figures are minimum-delay estimates: CPU contention and
other transfers only ever add time, so the fastest ping (as BBR's min-RTT filter) and the fastest payload are the
ones that show the link itself. On a loaded 2-core box the median of 5 pings read up to 27 % high
(benchmarks/RESULTS.md, probe section). A probe is bounded in bytes and time so that probing never
crowds out training, and the receiving side refuses payloads over its own limit.

The plan's own traffic is timed too (`carried`): a frame is a payload the link carried anyway, and by the same rule
only one faster than the probe's says something new, so it can raise a measurement until the next probe, never
lower it. A short probe reads a long fat link low (its payload ends before the sender's window has grown); a
training peer's frames, megabytes each, do not.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass
from typing import AsyncIterator  # hivemind's ServicerBase recognizes typing's alias only, not collections.abc's

from hivemind.p2p import P2P, P2PContext, PeerID, ServicerBase
from hivemind.proto import runtime_pb2
from hivemind.utils import get_dht_time

from hetswarm.client.peer.peer_gate import PeerGate
from hetswarm.protocol.errors import ConfigError
from hetswarm.protocol.limits import MAX_BANDWIDTH_MBPS
from hetswarm.protocol.records import LinkMeasurement
from hetswarm.protocol.units import BITS_PER_MBIT, MS_PER_S

logger = logging.getLogger(__name__)

PROBE_PART_BYTES = 256 * 1024
MAX_PROBE_BYTES = 32 * 2**20
"""Largest payload a peer accepts for one bandwidth probe."""
SMALL_PROBE_BYTES = 2 * PROBE_PART_BYTES
"""The first payload, which only sizes the others."""
PAYLOAD_SHARE = 0.75
"""The least share of a frame's time its bytes must take for the frame to count as a bandwidth sample (`carried`)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ProbeConfig:
    pings: int = 8
    """Unary pings per link; the fastest is kept."""
    ping_spacing_s: float = 0.1
    """Pause between pings, so that one busy moment of either peer does not delay them all."""
    max_payload_bytes: int = 8 * 2**20
    """Most bytes one bandwidth probe may stream."""
    target_s: float = 0.5
    """Aim for a payload that takes this long, so that fixed costs matter little."""
    bandwidth_rounds: int = 3
    """Payloads timed; the fastest is kept."""
    timeout_s: float = 60.0
    """Deadline for one whole link probe."""

    def __post_init__(self) -> None:
        if self.pings < 1 or self.bandwidth_rounds < 1:
            raise ConfigError(f"pings and bandwidth_rounds must be at least 1, got {self.pings}, {self.bandwidth_rounds}")
        if not SMALL_PROBE_BYTES <= self.max_payload_bytes <= MAX_PROBE_BYTES:
            raise ConfigError(f"max_payload_bytes must be in [{SMALL_PROBE_BYTES}, {MAX_PROBE_BYTES}], "
                             f"got {self.max_payload_bytes}")


class ProbeServicer(ServicerBase):
    """Answers pings and absorbs bandwidth probes; namespaced per swarm.

    Bounded per peer (client/peer/peer_gate.py): pings at a modest rate from anyone (a newcomer measures us before
    we see its record), payloads only from `admits`ed peers (those in view), one at a time and a few per minute,
    so nobody can make this peer absorb bytes without end.
    """

    def __init__(self, admits: Callable[[str], bool] | None = None,
                 look_for: Callable[[str], Awaitable[None]] | None = None) -> None:
        """
        Args:
            admits: whether a peer may send payloads (in view).
            look_for: awaited before `admits` asks: reads the view again if the peer is not in it yet.
        """
        self.pings = PeerGate(name="ping", max_concurrent=4, per_s=5.0, burst=40)
        self.payloads = PeerGate(name="bandwidth probe", max_concurrent=1, per_s=0.1, burst=12, admits=admits)
        self.look_for = look_for

    async def rpc_ping(self, request: runtime_pb2.ExpertRequest, context: P2PContext) -> runtime_pb2.ExpertResponse:
        with self.pings.enter(context.remote_id.to_base58()) as refused:
            return runtime_pb2.ExpertResponse(metadata=refused.encode() if refused else b"")

    async def rpc_absorb(
        self, requests: AsyncIterator[runtime_pb2.ExpertRequest], context: P2PContext
    ) -> runtime_pb2.ExpertResponse:
        if self.look_for is not None:
            await self.look_for(context.remote_id.to_base58())
        with self.payloads.enter(context.remote_id.to_base58()) as refused:
            if refused is not None:
                return runtime_pb2.ExpertResponse(metadata=refused.encode())  # unread: the stream is cut off
            received = 0
            async for request in requests:
                received += sum(len(tensor.buffer) for tensor in request.tensors)
                if received > MAX_PROBE_BYTES:
                    logger.warning(f"Refused a bandwidth probe from {context.remote_id}: over {MAX_PROBE_BYTES} bytes")
                    return runtime_pb2.ExpertResponse(metadata=b"too large")
            return runtime_pb2.ExpertResponse(metadata=str(received).encode())


async def _payload(n_bytes: int) -> AsyncIterator[runtime_pb2.ExpertRequest]:
    part = runtime_pb2.Tensor(buffer=bytes(PROBE_PART_BYTES))
    for offset in range(0, n_bytes, PROBE_PART_BYTES):
        size = min(PROBE_PART_BYTES, n_bytes - offset)
        yield runtime_pb2.ExpertRequest(tensors=[part if size == PROBE_PART_BYTES else runtime_pb2.Tensor(buffer=bytes(size))])


async def _stream_time(stub, n_bytes: int) -> float:
    start = time.perf_counter()
    try:
        ack = await stub.rpc_absorb(_payload(n_bytes))
    except ValueError:  # hivemind's asingle(): the stream closed with no answer
        raise ConnectionError("the peer cut the probe off unread (it refuses our probes for now)") from None
    elapsed = time.perf_counter() - start
    if ack.metadata != str(n_bytes).encode():
        raise ConnectionError(f"the peer did not absorb a {n_bytes}-byte probe: {ack.metadata[:64]!r}")
    return elapsed


def carried(link: LinkMeasurement, n_bytes: int, seconds: float) -> LinkMeasurement:
    """`link` after a message of `n_bytes` went over it and was answered in `seconds` (module docstring).

    The answer takes at least an RTT, so `seconds / 2` bounds the one-way latency; the time left after the probe's
    RTT is the payload's, counted only when it is at least PAYLOAD_SHARE of `seconds` (else the figure is mostly
    the latency's error: a latency read high by a quarter of `seconds` would overstate the bandwidth by a third)."""
    latency_ms = min(link.latency_ms, seconds / 2 * MS_PER_S)
    payload_s = seconds - 2 * latency_ms / MS_PER_S
    bandwidth_mbps = link.bandwidth_mbps
    if payload_s >= PAYLOAD_SHARE * seconds > 0:
        bandwidth_mbps = max(bandwidth_mbps, min(n_bytes * 8 / payload_s / BITS_PER_MBIT, MAX_BANDWIDTH_MBPS))
    return link.copy(update={"latency_ms": latency_ms, "bandwidth_mbps": bandwidth_mbps})


async def measure_link(p2p: P2P, peer: PeerID, *, namespace: str, config: ProbeConfig = ProbeConfig()) -> LinkMeasurement:
    """Fastest ping RTT and streamed-payload bandwidth to `peer`, within config.timeout_s.

    A payload can never beat its link, so bandwidth = bytes / (time - fastest RTT) errs low only, and the fastest
    of config.bandwidth_rounds payloads is kept. A small first payload sizes the others to take about
    config.target_s, so fixed costs matter little.
    """
    stub = ProbeServicer.get_stub(p2p, peer, namespace=namespace)
    async with asyncio.timeout(config.timeout_s):
        rtts = []
        for _ in range(config.pings):
            start = time.perf_counter()
            answer = await stub.rpc_ping(runtime_pb2.ExpertRequest())
            if answer.metadata:
                raise ConnectionError(f"the peer refused a ping: {answer.metadata[:80]!r}")
            rtts.append(time.perf_counter() - start)
            await asyncio.sleep(config.ping_spacing_s)
        fastest_rtt = min(rtts)
        rough_bytes_per_s = SMALL_PROBE_BYTES / max(await _stream_time(stub, SMALL_PROBE_BYTES) - fastest_rtt, 1e-3)
        n_bytes = int(min(max(rough_bytes_per_s * config.target_s, SMALL_PROBE_BYTES), config.max_payload_bytes))
        best_s = min([await _stream_time(stub, n_bytes) for _ in range(config.bandwidth_rounds)])
    return LinkMeasurement(
        latency_ms=fastest_rtt / 2 * MS_PER_S,
        # a payload no slower than a ping (loopback) says only that the link is faster than records can hold
        bandwidth_mbps=min(n_bytes * 8 / max(best_s - fastest_rtt, 1e-6) / BITS_PER_MBIT, MAX_BANDWIDTH_MBPS),
        measured_at=get_dht_time(),
        samples=config.pings,
    )


async def unanswered(p2p: P2P, peers: Collection[str], *, namespace: str, timeout_s: float,
                     again_s: float | None = None) -> set[str]:
    """The peers among `peers` that answer no ping within `timeout_s`, nor, with `again_s`, a second one within
    that: a refusal is an answer (the peer is up); a failed dial, a timeout or a missing handler is not. The
    coordinator asks this of a plan's peers before it publishes the plan (coordinator/broadcaster.py): its own
    observation, not a member's word. A dead peer's dial fails at once, so the second chance costs it little, and a
    peer on a busy machine that answers late is not planned out."""
    silent = await _unanswered_once(p2p, peers, namespace=namespace, timeout_s=timeout_s)
    if silent and again_s is not None:
        silent = await _unanswered_once(p2p, silent, namespace=namespace, timeout_s=again_s)
    return silent


async def _unanswered_once(p2p: P2P, peers: Collection[str], *, namespace: str, timeout_s: float) -> set[str]:
    async def answers(peer: str) -> bool:
        try:
            stub = ProbeServicer.get_stub(p2p, PeerID.from_base58(peer), namespace=namespace)
            await stub.rpc_ping(runtime_pb2.ExpertRequest(), timeout=timeout_s)
            return True
        except Exception as e:  # P2PDaemonError or ControlFailure (dead), TimeoutError, P2PHandlerError
            logger.debug(f"{peer} did not answer a ping: {type(e).__name__}: {e}")
            return False

    peers = sorted(peers)
    return {peer for peer, answered in zip(peers, await asyncio.gather(*map(answers, peers))) if not answered}
