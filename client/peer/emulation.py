"""Link emulation: a swarm on one machine behaves as if its peers sat at the sites of a real-world scenario.

`EmulatedP2P` wraps hivemind's P2P. Every message this peer sends to a peer at a known site (requests from our
stubs, responses from our handlers) is paced to that site pair's bandwidth and delivered after its one-way
latency. Each direction of each link has one transmitter that messages queue for, as on a real wire, and a
stream's messages overlap their flight time, so N bytes cost `latency + N / bandwidth`, not N latencies. Probes,
activations and the all-reduce all go through it, so the probe measures the emulated figures and the scheduler
sees a real-world network.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from hivemind.p2p import P2P, P2PContext, PeerID
from hivemind.utils.asyncio import as_aiter

from hetswarm.protocol.errors import HetswarmError
from hetswarm.protocol.network import Network, load_network
from hetswarm.protocol.units import BITS_PER_MBIT, MBPS_PER_GBPS, MS_PER_S

logger = logging.getLogger(__name__)

_DELAY_LINE_DEPTH = 64
"""Messages a stream may have in flight on an emulated link before its producer waits."""


@dataclass(frozen=True)
class SiteLinks:
    """One-way latency (ms) and bandwidth (Mbit/s) between every pair of sites of a scenario, both ways equal."""

    latency_ms: dict[tuple[str, str], float]
    bandwidth_mbps: dict[tuple[str, str], float]

    @classmethod
    def from_network(cls, network: Network, *, bandwidth_scale: float = 1.0) -> SiteLinks:
        """Site-pair figures from any two distinct devices at those sites; `bandwidth_scale` slows every link."""
        if bandwidth_scale <= 0:
            raise HetswarmError(f"bandwidth scale must be positive, got {bandwidth_scale}")
        devices: dict[str, list[int]] = {}
        for device, site in enumerate(network.sites):
            devices.setdefault(site, []).append(device)
        latency, bandwidth = {}, {}
        for a, members_a in devices.items():
            for b, members_b in devices.items():
                pair = [(d, e) for d in members_a[:2] for e in members_b[:2] if d != e]
                if not pair:
                    continue  # a site with one device has no intra-site link
                d, e = pair[0]
                latency[a, b] = float(network.latency_ms[d, e])
                bandwidth[a, b] = float(network.bandwidth_gbps[d, e]) * MBPS_PER_GBPS * bandwidth_scale
        return cls(latency, bandwidth)

    @classmethod
    def from_scenario(cls, scenario: str, *, bandwidth_scale: float = 1.0) -> SiteLinks:
        return cls.from_network(load_network(scenario), bandwidth_scale=bandwidth_scale)

    @property
    def sites(self) -> list[str]:
        return sorted({a for a, _ in self.latency_ms})

    def link(self, a: str, b: str) -> tuple[float, float]:
        """(one-way latency ms, bandwidth Mbit/s) from site a to site b."""
        return self.latency_ms[a, b], self.bandwidth_mbps[a, b]

    def check_site(self, site: str) -> str:
        if site not in self.sites:
            raise HetswarmError(f"unknown site {site!r}; this scenario has: {', '.join(self.sites)}")
        return site


class LinkShaper:
    """Decides when each outgoing message reaches its peer, one transmitter per destination."""

    def __init__(self, links: SiteLinks, my_site: str, site_of: Callable[[PeerID], Awaitable[str | None]]):
        self.links, self.my_site, self._site_of = links, links.check_site(my_site), site_of
        self._free_at: dict[PeerID, float] = {}
        self._unknown_logged: set[PeerID] = set()

    async def arrival_time(self, peer: PeerID, n_bytes: int) -> float | None:
        """Loop time at which a message of `n_bytes` sent now reaches `peer`; None for a peer of unknown site."""
        site = await self._site_of(peer)
        if site is None or (self.my_site, site) not in self.links.latency_ms:
            if peer not in self._unknown_logged:
                self._unknown_logged.add(peer)
                logger.debug(f"No emulated link to {peer} (site {site!r}): its messages are not delayed")
            return None
        latency_ms, bandwidth_mbps = self.links.link(self.my_site, site)
        now = asyncio.get_running_loop().time()
        start = max(now, self._free_at.get(peer, now))
        done = start + n_bytes * 8 / (bandwidth_mbps * BITS_PER_MBIT)
        self._free_at[peer] = done
        return done + latency_ms / MS_PER_S

    async def deliver(self, peer: PeerID, n_bytes: int) -> None:
        """Waits until a message of `n_bytes` would have arrived at `peer`."""
        arrival = await self.arrival_time(peer, n_bytes)
        if arrival is not None:
            await asyncio.sleep(max(0.0, arrival - asyncio.get_running_loop().time()))

    async def delay_line(self, peer: PeerID, messages: AsyncIterable) -> AsyncIterator:
        """Yields each message when it would arrive; the next one is already on the wire meanwhile."""
        queue: asyncio.Queue = asyncio.Queue(maxsize=_DELAY_LINE_DEPTH)

        async def transmit() -> None:
            try:
                async for message in messages:
                    await queue.put((await self.arrival_time(peer, message.ByteSize()), message, None))
            except Exception as e:  # handed to the reader, which raises it where the stream is consumed
                await queue.put((None, None, e))
            await queue.put(None)

        transmitter = asyncio.create_task(transmit())
        try:
            while (item := await queue.get()) is not None:
                arrival, message, error = item
                if error is not None:
                    raise error
                if arrival is not None:
                    await asyncio.sleep(max(0.0, arrival - asyncio.get_running_loop().time()))
                yield message
        finally:
            transmitter.cancel()


class EmulatedP2P:
    """A hivemind P2P whose outgoing messages pay the emulated links; everything else is the wrapped P2P's."""

    def __init__(self, p2p: P2P, shaper: LinkShaper):
        self._p2p, self.shaper = p2p, shaper

    def __getattr__(self, name: str):
        return getattr(self._p2p, name)

    async def call_protobuf_handler(self, peer_id: PeerID, name: str, input, output_protobuf_type):
        if isinstance(input, AsyncIterable):
            input = self.shaper.delay_line(peer_id, input)
        else:
            await self.shaper.deliver(peer_id, input.ByteSize())
        return await self._p2p.call_protobuf_handler(peer_id, name, input, output_protobuf_type)

    async def iterate_protobuf_handler(self, peer_id: PeerID, name: str, input, output_protobuf_type):
        requests = input if isinstance(input, AsyncIterable) else as_aiter(input)
        delayed = self.shaper.delay_line(peer_id, requests)
        return await self._p2p.iterate_protobuf_handler(peer_id, name, delayed, output_protobuf_type)

    async def add_protobuf_handler(self, name: str, handler, input_protobuf_type, *, stream_input: bool = False,
                                   stream_output: bool = False, balanced: bool = False) -> None:
        if stream_output:
            def shaped(request, context: P2PContext):
                return self.shaper.delay_line(context.remote_id, handler(request, context))
        else:
            async def shaped(request, context: P2PContext):
                response = await handler(request, context)
                await self.shaper.deliver(context.remote_id, response.ByteSize())
                return response
        await self._p2p.add_protobuf_handler(name, shaped, input_protobuf_type, stream_input=stream_input,
                                             stream_output=stream_output, balanced=balanced)
