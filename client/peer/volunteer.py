"""A volunteer's life in the swarm: publish its record on a heartbeat, watch who is there, measure its links.

Three loops share one event loop and die together (asyncio.TaskGroup): the heartbeat refreshes the PeerRecord
every T/2 with expiry T, so a silent peer disappears within T; the view reads everyone's records and wakes the
prober when a new peer appears; the prober measures links, a bounded number per round, with a backoff for peers
whose probe failed (client/peer/link_prober.py). The record is published by the heartbeat, plus once after a round
that measured something new: a peer that cannot be probed never makes the record be stored over and over (of
overlapping stores, the DHT refuses one). With a pinned coordinator a fourth loop follows its assignments
(client/peer/assignment_follower.py),
publishes the role at once and hands each newly accepted assignment to the training side through the
`on_assignment` hook.
"""
from __future__ import annotations

import asyncio
import collections
import contextlib
import importlib.metadata
import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from hivemind.utils import get_dht_time

from hetswarm.client.peer.assignment_follower import AssignmentFollower
from hetswarm.client.peer.link_probe import ProbeConfig, ProbeServicer
from hetswarm.client.peer.link_prober import LinkProber
from hetswarm.client.peer.node import SwarmNode
from hetswarm.protocol.errors import ConfigError
from hetswarm.protocol.keys import ASSIGNMENT_FIELD, MEASURE_FIELD
from hetswarm.protocol.limits import DHT_TIMEOUT_S, MAX_LINKS_PER_RECORD, MAX_TOKEN_CHARS, VIEW_BEAM_SIZE
from hetswarm.protocol.measurement_policy import DEFAULT_MAX_LINKS, partners_in
from hetswarm.protocol.record_store import check_ttl
from hetswarm.protocol.records import Assignment, CheckpointInfo, Hardware, LinkMeasurement, PeerRecord, PeerState
from hetswarm.protocol.remembered_peers import RememberedPeers

logger = logging.getLogger(__name__)

VERSION = importlib.metadata.version("hetswarm")
LOOK_AGAIN_S = 30.0
"""A caller not in view makes this peer read the records for it at most this often (`Volunteer._look_for`)."""
MAX_LOOKED_FOR = 4096
"""Callers remembered for that; past it, those older than LOOK_AGAIN_S are forgotten."""


@dataclass(frozen=True, kw_only=True, slots=True)
class VolunteerConfig:
    ttl_s: float = 60.0
    """Record expiry T; the heartbeat refreshes every T/2, and after a store no DHT node took, again after T/10 (at
    most 1 s), twice that after each further refusal up to T/6, so that a busy moment does not let the record
    expire and a busy DHT is not asked every second."""
    view_interval_s: float = 5.0
    """How often the swarm's records are read, in a swarm of up to 20 peers (`view_wait_s`)."""
    reprobe_s: float = 600.0
    """Links are measured again after this long, and at once when a new peer appears."""
    max_probes_per_round: int = 8
    max_links: int = DEFAULT_MAX_LINKS
    """The links this peer measures and its record lists, at most (protocol/measurement_policy.py): up to this
    many other peers, every pair is measured."""
    probe_backoff_s: float = 5.0
    """After a failed probe the peer is tried again after this long, doubling with each failure in a row."""
    probe_backoff_max_s: float = 300.0
    """The longest wait between probes of a peer that keeps failing; a success resets the backoff."""
    probe: ProbeConfig = ProbeConfig()
    public_name: str | None = None
    site: str | None = None
    coordinator: str | None = None
    """Peer id of the coordinator whose assignments this peer follows; None follows nobody."""
    assignment_poll_s: float = 2.0
    """How often the assignment key is read when following a coordinator, by a member of its plan (a standby in a
    big swarm reads it less often: `follow_wait_s`)."""
    join_token: str | None = None
    """The coordinator's token that admits this peer to a closed swarm (protocol/join_tokens.py)."""

    def __post_init__(self) -> None:
        if self.join_token is not None and len(self.join_token) > MAX_TOKEN_CHARS:
            raise ConfigError(f"a join token has at most {MAX_TOKEN_CHARS} characters; this one has "
                              f"{len(self.join_token)}: check that it was pasted whole and alone")
        if self.assignment_poll_s <= 0:
            raise ConfigError(f"assignment_poll_s must be positive, got {self.assignment_poll_s}")
        check_ttl(self.ttl_s)
        if self.view_interval_s <= 0 or self.reprobe_s <= 0 or self.max_probes_per_round < 1:
            raise ConfigError(f"bad timing: view_interval_s={self.view_interval_s}, "
                             f"reprobe_s={self.reprobe_s}, max_probes_per_round={self.max_probes_per_round}")
        if not 1 <= self.max_links <= MAX_LINKS_PER_RECORD:
            raise ConfigError(f"max_links must be within 1..{MAX_LINKS_PER_RECORD}, got {self.max_links}")
        if not 0 < self.probe_backoff_s <= self.probe_backoff_max_s:
            raise ConfigError(f"need 0 < probe_backoff_s <= probe_backoff_max_s, got {self.probe_backoff_s} and "
                             f"{self.probe_backoff_max_s}")


VIEW_S_PER_PEER = 0.25
"""A read of the swarm's records returns every peer's, so N peers reading every s seconds ask the DHT for N²/s
records. Past `view_interval_s / VIEW_S_PER_PEER` peers the interval grows with the swarm instead (`view_wait_s`),
keeping that load linear in N, up to the cap of `view_wait_s`: 12 s from 48 peers with the default T of 60 s."""


def view_wait_s(config: VolunteerConfig, peers: int) -> float:
    """Seconds between reads of the swarm's records with `peers` in view: `view_interval_s`, longer in a big swarm
    (VIEW_S_PER_PEER) but no longer than T/5: a record read lives at least T/2 more (its owner refreshes it every
    T/2, for T), and two reads within that keep a live peer in view through one read that missed it
    (protocol/remembered_peers.py)."""
    return max(config.view_interval_s, min(VIEW_S_PER_PEER * peers, config.ttl_s / 5))


STANDBY_READS_PER_S = 10.0
"""Every peer polls the coordinator's plan, and the few DHT nodes that hold its key serve every poll. The plan's
members poll every `assignment_poll_s`; the peers it leaves standing by (all of them, before the first plan) poll
together about this many times a second at most (`follow_wait_s`): every 2 s up to 20 peers, 6.4 s at 64."""
MAX_STANDBY_POLL_S = 15.0
"""A standby finds a plan that places it within this long, however big the swarm."""


def follow_wait_s(config: VolunteerConfig, peers: int, *, placed: bool) -> float:
    """Seconds between reads of the plan and the coordinator's link requests (STANDBY_READS_PER_S)."""
    if placed:
        return config.assignment_poll_s
    return max(config.assignment_poll_s, min(peers / STANDBY_READS_PER_S, MAX_STANDBY_POLL_S))


OnAssignment = Callable[[Assignment], Awaitable[None]]


class Volunteer:
    """A peer's life in the swarm (module docstring).

    Args:
        checkpoints: the checkpoints this peer holds, for its record; None when it keeps none.
        on_assignment: awaited as a task with each newly accepted assignment of the pinned coordinator (never with
            an older or equal version); the poll loop does not wait for it. Its failures are logged; tasks still
            running when the volunteer stops are cancelled.
    """

    def __init__(self, node: SwarmNode, hardware: Hardware, config: VolunteerConfig, *,
                 on_assignment: OnAssignment | None = None,
                 checkpoints: Callable[[], list[CheckpointInfo]] | None = None):
        self.node, self.hardware, self.config = node, hardware, config
        self._checkpoints = checkpoints
        self.follower = AssignmentFollower(config.coordinator, node.peer_id) if config.coordinator else None
        self._on_assignment = on_assignment
        self._hook_tasks: set[asyncio.Task] = set()
        self.state: PeerState = "joining"
        self.prober = LinkProber(node, config, partners=lambda: partners_in(
            self.follower.current if self.follower else None, node.peer_id))
        self.peers: dict[str, PeerRecord] = {}
        self.remembered = RememberedPeers()
        """The records read, kept until they expire (protocol/remembered_peers.py): `peers` is their active part."""
        self._publishing: asyncio.Task | None = None
        self._look_now = asyncio.Event()
        """Set to read the swarm's records before the next view interval is up."""
        self._views, self._reading = 0, False
        self._looked_for: dict[str, float] = {}
        """Peer not in view → when a call of its last made us read the records for it (`_look_for`)."""
        self._viewed = asyncio.Condition()
        """Notified after each read of the swarm's records (`_views` counts them; `_reading` while one runs)."""
        self._probe_wanted = asyncio.Event()
        self._probe_wanted.set()  # the first round turns `joining` into `ready`, even with nobody to measure
        self._publish_lock = asyncio.Lock()
        self._refused = asyncio.Event()
        """Set when no DHT node took a store of our record: the heartbeat tries again soon (`_heartbeat`)."""
        self.publishes: collections.Counter[str] = collections.Counter()
        """Records published, by reason (start, heartbeat, probe, assignment, leaving): for logs and tests."""

    @property
    def namespace(self) -> str:
        return self.prober.namespace

    @property
    def links(self) -> dict[str, LinkMeasurement]:
        """This peer's link measurements (client/peer/link_prober.py)."""
        return self.prober.links

    def record(self) -> PeerRecord:
        role = self.follower.role if self.follower else None
        return PeerRecord(
            peer_id=self.node.peer_id,
            maddrs=[str(m) for m in self.node.dht.get_visible_maddrs()][:16],
            version=VERSION,
            hardware=self.hardware,
            links=self.prober.newest_links(),
            state="training" if self.state == "ready" and role is not None else self.state,
            public_name=self.config.public_name,
            site=self.config.site,
            assignment_version=self.follower.current.version if self.follower and self.follower.current else None,
            role=role,
            checkpointing=self._checkpoints is not None,
            checkpoints=self._checkpoints() if self._checkpoints is not None else [],
            join_token=self.config.join_token,
            updated_at=get_dht_time(),
        )

    def publish_soon(self, reason: str) -> None:
        """Publishes our record in the background (one pending at a time): something in it changed."""
        if self._publishing is None or self._publishing.done():
            self._publishing = asyncio.create_task(self.publish_record(reason))

    async def publish_record(self, reason: str = "update") -> bool:
        """Stores our record; one store at a time, since of two overlapping stores the DHT refuses one. Returns
        whether a DHT node took it."""
        async with self._publish_lock:
            self.publishes[reason] += 1
            logger.debug(f"Publishing our record ({reason})")
            try:
                stored = await self.node.records.publish(self.record(), ttl_s=self.config.ttl_s)
            except TimeoutError:
                stored = False
        if not stored:
            self._refused.set()
            logger.warning(f"No DHT node accepted our peer record ({reason}); the heartbeat tries again soon")
        return stored

    async def run(self, stop: asyncio.Event) -> None:
        """Serves until `stop` is set, then publishes `leaving` once."""
        await ProbeServicer(admits=self._in_view, look_for=self._look_for).add_p2p_handlers(
            self.node.p2p, namespace=self.namespace)
        await self.publish_record("start")
        try:
            async with asyncio.TaskGroup() as tasks:
                loops = [self._heartbeat, self._watch, self._probe] + ([self._follow] if self.follower else [])
                running = [tasks.create_task(loop()) for loop in loops]
                await stop.wait()
                for task in running + list(self._hook_tasks):
                    task.cancel()
        finally:
            self.state = "leaving"
            await self.publish_record("leaving")
            logger.info("Published `leaving`; goodbye")

    async def _follow(self) -> None:
        """Polls the assignment key, and the links the coordinator asks to be measured first; a newly accepted
        plan is published in our record and handed to the hook."""
        while True:
            coordinator = self.follower.coordinator_id
            try:
                found = await self.node.records.read_many((ASSIGNMENT_FIELD, MEASURE_FIELD), prefer=(coordinator,),
                                                           beam_size=VIEW_BEAM_SIZE)
                entries = found[ASSIGNMENT_FIELD]
                if self.prober.ask(found[MEASURE_FIELD].get(coordinator)):
                    self._probe_wanted.set()
            except TimeoutError:
                logger.debug("Reading the assignment or the link requests timed out")
                entries = {}
            if (accepted := self.follower.consider(entries)) is not None:
                await self.publish_record("assignment")
                if self._on_assignment is not None:
                    task = asyncio.create_task(self._on_assignment(accepted), name=f"assignment-v{accepted.version}")
                    self._hook_tasks.add(task)
                    task.add_done_callback(self._hook_done)
            await asyncio.sleep(follow_wait_s(self.config, len(self.peers), placed=self.follower.role is not None))

    def _hook_done(self, task: asyncio.Task) -> None:
        self._hook_tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.error(f"on_assignment failed for {task.get_name()}", exc_info=task.exception())

    async def _heartbeat(self) -> None:
        """A CI run saw a record refused once on a loaded machine expire before the next T/2 heartbeat, and the
        coordinator plan its peer out; so a refused store is tried again within a second. Further refusals double
        the wait up to T/6, which still tries thrice within the T/2 the last stored record has left: at 64 peers on
        2 cores (benchmarks/swarm_scale.py) an overloaded DHT refused 1,500 stores, and a retry every second for
        each peer kept it overloaded. A refused store of news (new links, an accepted plan) is retried the same way,
        rather than left to the next heartbeat: the coordinator may be waiting for those links to publish a plan."""
        first_retry_s, max_retry_s = min(1.0, self.config.ttl_s / 10), self.config.ttl_s / 6
        retry_s = None
        while True:
            if retry_s is None:
                self._refused.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._refused.wait(), timeout=self.config.ttl_s / 2)
                    retry_s = first_retry_s  # another store of ours was refused
            if retry_s is not None:
                await asyncio.sleep(retry_s)
            if await self.publish_record("heartbeat"):
                retry_s = None
            else:
                retry_s = min(2 * retry_s if retry_s else first_retry_s, max_retry_s)

    async def _watch(self) -> None:
        while True:
            self._look_now.clear()  # a look asked for while this read runs gets a read of its own
            self._reading = True
            try:
                peers = await self.remembered.read(self.node.records, beam_size=VIEW_BEAM_SIZE)
            except TimeoutError:
                self._reading = False
                logger.debug("Reading the swarm's peer records timed out; trying again")
                await asyncio.sleep(self.config.view_interval_s)
                continue
            peers.pop(self.node.peer_id, None)
            active = {p: r for p, r in peers.items() if r.state != "leaving"}
            new = set(active) - set(self.peers)
            self.peers = active
            self.node.sites.update({p: r.site for p, r in peers.items() if r.site is not None})
            if new:
                logger.info(f"{len(new)} new peer(s); {len(self.peers)} in view")
                self._probe_wanted.set()
            async with self._viewed:
                self._reading, self._views = False, self._views + 1
                self._viewed.notify_all()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._look_now.wait(), timeout=view_wait_s(self.config, len(self.peers)))

    async def _look_for(self, peer: str) -> None:
        """Returns once `peer` is in view or the records were read once more from the start (at most two DHT reads
        later): a peer that just joined probes us as soon as it sees our record, maybe before we read its. A peer
        looked for in the last LOOK_AGAIN_S is not waited for again (a stranger's calls are refused at once)."""
        now = time.monotonic()
        if peer in self.peers or now - self._looked_for.get(peer, -math.inf) < LOOK_AGAIN_S:
            return
        if len(self._looked_for) > MAX_LOOKED_FOR:
            self._looked_for = {p: t for p, t in self._looked_for.items() if now - t < LOOK_AGAIN_S}
        self._looked_for[peer] = now
        fresh = self._views + (2 if self._reading else 1)  # a read that started after this call
        self._look_now.set()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(2 * DHT_TIMEOUT_S), self._viewed:
                await self._viewed.wait_for(lambda: peer in self.peers or self._views >= fresh)

    def _in_view(self, peer: str) -> bool:
        """Whether `peer` has a record in our view; a peer that has none yet (it may have just joined) makes us
        read the records again at once, so that its retried probe finds it."""
        if peer in self.peers:
            return True
        self._look_now.set()
        return False

    async def _probe(self) -> None:
        """Probes the due peers whenever some are due or the view found new ones (client/peer/link_prober.py);
        publishes only news."""
        while True:
            wait_s = self.prober.wait_s(self.peers)
            if wait_s > 0:
                try:
                    await asyncio.wait_for(self._probe_wanted.wait(), timeout=min(wait_s, self.config.reprobe_s))
                except TimeoutError:
                    pass
            self._probe_wanted.clear()
            news = await self.prober.round(self.peers) or self.state == "joining"
            if self.state == "joining":
                self.state = "ready"
            if news:
                await self.publish_record("probe")
