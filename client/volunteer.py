"""A volunteer's life in the swarm: publish its record on a heartbeat, watch who is there, measure its links.

Three loops share one event loop and die together (asyncio.TaskGroup): the heartbeat refreshes the PeerRecord
every T/2 with expiry T, so a silent peer disappears within T; the view reads everyone's records and wakes the
prober when a new peer appears; the prober measures links, a bounded number per round.
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, replace

from hivemind.utils import get_dht_time

from hetswarm.client.link_probe import ProbeConfig, ProbeServicer, measure_link
from hetswarm.client.node import SwarmNode, peer_from_id
from hetswarm.protocol.keys import PEERS_FIELD
from hetswarm.protocol.record_store import publish, read_records
from hetswarm.protocol.records import Hardware, LinkMeasurement, PeerRecord, PeerState

logger = logging.getLogger(__name__)

VERSION = "0.1.0"


@dataclass(frozen=True, kw_only=True, slots=True)
class VolunteerConfig:
    ttl_s: float = 60.0
    """Record expiry T; the heartbeat refreshes every T/2."""
    view_interval_s: float = 5.0
    """How often the swarm's records are read."""
    reprobe_s: float = 600.0
    """Links are measured again after this long, and at once when a new peer appears."""
    max_probes_per_round: int = 8
    probe: ProbeConfig = ProbeConfig()
    public_name: str | None = None
    site: str | None = None

    def __post_init__(self) -> None:
        if self.ttl_s < 2 or self.view_interval_s <= 0 or self.max_probes_per_round < 1:
            raise ValueError(f"bad timing: ttl_s={self.ttl_s}, view_interval_s={self.view_interval_s}, "
                             f"max_probes_per_round={self.max_probes_per_round}")


class Volunteer:
    def __init__(self, node: SwarmNode, hardware: Hardware, config: VolunteerConfig):
        self.node, self.hardware, self.config = node, hardware, config
        self.state: PeerState = "joining"
        self.links: dict[str, LinkMeasurement] = {}
        self.peers: dict[str, PeerRecord] = {}
        self._probe_wanted = asyncio.Event()
        self._probe_wanted.set()  # the first round turns `joining` into `ready`, even with nobody to measure

    @property
    def namespace(self) -> str:
        return f"{self.node.config.swarm}.probe"

    def record(self) -> PeerRecord:
        return PeerRecord(
            peer_id=self.node.peer_id,
            maddrs=[str(m) for m in self.node.dht.get_visible_maddrs()][:16],
            version=VERSION,
            hardware=self.hardware,
            links=dict(self.links),
            state=self.state,
            public_name=self.config.public_name,
            site=self.config.site,
            updated_at=get_dht_time(),
        )

    async def publish_record(self) -> None:
        stored = await publish(self.node.dht, self.node.config.swarm, PEERS_FIELD, self.record(),
                               private_key=self.node.private_key, ttl_s=self.config.ttl_s)
        if not stored:
            logger.warning("No DHT node accepted our peer record; retrying at the next heartbeat")

    async def run(self, stop: asyncio.Event) -> None:
        """Serves until `stop` is set, then publishes `leaving` once."""
        await ProbeServicer().add_p2p_handlers(self.node.p2p, namespace=self.namespace)
        await self.publish_record()
        try:
            async with asyncio.TaskGroup() as tasks:
                loops = [tasks.create_task(loop()) for loop in (self._heartbeat, self._watch, self._probe)]
                await stop.wait()
                for loop in loops:
                    loop.cancel()
        finally:
            self.state = "leaving"
            await self.publish_record()
            logger.info("Published `leaving`; goodbye")

    async def _heartbeat(self) -> None:
        while True:
            await asyncio.sleep(self.config.ttl_s / 2)
            await self.publish_record()

    async def _watch(self) -> None:
        while True:
            peers = await read_records(self.node.dht, self.node.config.swarm, PEERS_FIELD, PeerRecord)
            peers.pop(self.node.peer_id, None)
            active = {p: r for p, r in peers.items() if r.state != "leaving"}
            new = set(active) - set(self.peers)
            self.peers = active
            self.node.sites.update({p: r.site for p, r in peers.items() if r.site is not None})
            if new:
                logger.info(f"{len(new)} new peer(s); {len(self.peers)} in view")
                self._probe_wanted.set()
            await asyncio.sleep(self.config.view_interval_s)

    def _due_for_probe(self) -> list[str]:
        """Unmeasured peers first, then the stalest measurements, at most max_probes_per_round.

        Each pair is measured by its peer with the smaller id: half the probe traffic, and no probe's pings wait
        behind the other side's payload on the same link. Links count as symmetric, as the paper's model has them.
        """
        now = get_dht_time()
        mine = [p for p in self.peers if p > self.node.peer_id]
        due = [p for p in mine if p not in self.links or now - self.links[p].measured_at > self.config.reprobe_s]
        due.sort(key=lambda p: self.links[p].measured_at if p in self.links else -1.0)
        return due[: self.config.max_probes_per_round]

    async def _probe(self) -> None:
        while True:
            try:
                await asyncio.wait_for(self._probe_wanted.wait(), timeout=self.config.reprobe_s)
            except TimeoutError:
                pass
            self._probe_wanted.clear()
            for peer in self._due_for_probe():
                try:
                    link = await measure_link(self.node.p2p, peer_from_id(peer), namespace=self.namespace,
                                              config=self.config.probe)
                except Exception as e:  # a dead or misbehaving peer costs one probe, never the client
                    logger.debug(f"Probe of {peer} failed: {e!r}", exc_info=True)
                    continue
                self.links[peer] = link
                logger.info(f"Link to {peer[-6:]}: {link.latency_ms:.1f} ms, {link.bandwidth_mbps:.1f} Mbit/s")
            self.links = {p: m for p, m in self.links.items() if p in self.peers}
            if self.state == "joining":
                self.state = "ready"
            await self.publish_record()
            if self._due_for_probe():
                self._probe_wanted.set()
