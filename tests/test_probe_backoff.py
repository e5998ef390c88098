"""A peer in view that cannot be probed is retried with exponential backoff, and our record is not republished on
every probe pass: the heartbeat publishes it, plus once per round that measured something new.

The swarm is real, on 127.0.0.1: a `silent` node publishes a valid signed PeerRecord but serves no probe handler
(as a peer without the probe service, or a crashed one until its record expires); a `good` peer is a Volunteer;
`me` is a Volunteer with the smallest peer id, so it is the one that measures both links. Before the backoff, `me`
probed `silent` about 1500 times in 20 s and published its record as often. A store no DHT node took (a heartbeat's
or news') is tried again within a second, not a period later, and further refusals back off (on a stand-in record
store). A volunteer that measured more links than a record holds publishes the newest.
"""
from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import hivemind
import numpy as np
import pytest
from hivemind.utils import get_dht_time
from hivemind.utils.crypto import RSAPrivateKey

from hetswarm.client.peer.addresses import LOOPBACK
from hetswarm.client.peer.hivemind_compat import load_identity
from hetswarm.client.peer.link_probe import SMALL_PROBE_BYTES, ProbeConfig
from hetswarm.client.peer.node import Identity, NodeConfig, SwarmNode, start_dht
from hetswarm.client.peer.volunteer import Volunteer, VolunteerConfig
from hetswarm.coordinator.swarm_view import build_view
from hetswarm.protocol.errors import ConfigError
from hetswarm.protocol.identity import peer_id_of
from hetswarm.protocol.keys import PEERS_FIELD
from hetswarm.protocol.limits import MAX_LINKS_PER_RECORD
from hetswarm.protocol.record_store import SwarmRecords
from hetswarm.protocol.records import Hardware, LinkMeasurement, LinkRequests, PeerRecord
from tests.helpers.dht_nodes import start_node
from tests.helpers.swarm_records import IDS, make_record

pytestmark = pytest.mark.timeout(120)

SWARM = "backoff"
RUN_S = 12.0
TTL_S = 8.0
"""Heartbeat every 4 s."""
BACKOFF_S = 1.0
"""Tries of the silent peer at about 0, 1, 3 and 7 s after it comes into view (the next at 15): at most 4 in RUN_S."""
HARDWARE = Hardware(device="cpu", device_name="test", tflops=1.0, dtype="float32", memory_gib=1.0)
QUICK_PROBE = ProbeConfig(pings=2, ping_spacing_s=0.01, max_payload_bytes=SMALL_PROBE_BYTES, bandwidth_rounds=1,
                          target_s=0.05, timeout_s=10.0)
CONFIG = VolunteerConfig(ttl_s=TTL_S, view_interval_s=1.0, probe_backoff_s=BACKOFF_S, probe_backoff_max_s=60.0,
                         probe=QUICK_PROBE)


def identities(folder: Path, names: list[str]) -> dict[str, Identity]:
    """New identities, named in the order of their peer ids (the smaller id of a pair measures the link)."""
    keys: list[tuple[str, Path, RSAPrivateKey]] = []
    for i in range(len(names)):
        path = folder / f"{i}.key"
        key = load_identity(path)
        keys.append((peer_id_of(key.get_public_key()), path, key))
    return {name: Identity(path, key) for name, (_, path, key) in zip(names, sorted(keys))}


async def publish_silent_record(dht: hivemind.DHT, identity: Identity) -> None:
    """A valid, signed record of a peer that serves no probe handler."""
    record = PeerRecord(peer_id=identity.peer_id, maddrs=[str(m) for m in dht.get_visible_maddrs()], version="test",
                        hardware=HARDWARE, state="ready", updated_at=get_dht_time())
    assert await SwarmRecords(dht, SWARM, private_key=identity.private_key).publish(record, ttl_s=120.0)


async def run_volunteers(nodes: dict[str, tuple[NodeConfig, hivemind.DHT, Identity]], run_s: float,
                         config: VolunteerConfig = CONFIG,
                         during: Callable[[dict[str, Volunteer]], Awaitable[None]] | None = None
                         ) -> dict[str, Volunteer]:
    """Runs one Volunteer per node in this event loop for `run_s` (or while `during` runs), then stops them (each
    publishes `leaving`)."""
    attached = {name: await SwarmNode.attach(node_config, dht, identity)
                for name, (node_config, dht, identity) in nodes.items()}
    volunteers = {name: Volunteer(node, HARDWARE, config) for name, node in attached.items()}
    stop = asyncio.Event()
    try:
        async with asyncio.timeout(run_s + 30):
            async with asyncio.TaskGroup() as tasks:
                for volunteer in volunteers.values():
                    tasks.create_task(volunteer.run(stop))
                await (during(volunteers) if during is not None else asyncio.sleep(run_s))
                stop.set()
    finally:
        for node in attached.values():
            await node.p2p.shutdown()
    return volunteers


@pytest.mark.swarm
@pytest.mark.timing  # counts attempts in a 12 s window: a loaded machine refuses a first probe (not yet in view)
def test_an_unprobeable_peer_is_retried_with_backoff_and_the_record_is_not_republished_per_pass(tmp_path):
    ids = identities(tmp_path, ["me", "silent", "good"])
    silent_dht, _ = start_node(SWARM, ids["silent"].path)
    dhts = [silent_dht]
    try:
        config = NodeConfig(swarm=SWARM, initial_peers=tuple(str(m) for m in silent_dht.get_visible_maddrs()),
                            host_maddrs=(LOOPBACK,))
        nodes = {}
        for name in ("me", "good"):
            dhts.append(start_dht(config, ids[name]))
            nodes[name] = (config, dhts[-1], ids[name])

        async def scenario() -> dict[str, Volunteer]:
            await publish_silent_record(silent_dht, ids["silent"])
            return await run_volunteers(nodes, RUN_S)

        me = asyncio.run(scenario())["me"]
    finally:
        for dht in reversed(dhts):
            dht.shutdown()

    silent, good = ids["silent"].peer_id, ids["good"].peer_id
    assert silent in me.peers, "the silent peer was in view all along"
    assert 2 <= me.prober.probe_attempts[silent] <= 4, me.prober.probe_attempts
    assert silent not in me.prober.links
    # others are measured as before
    assert me.prober.probe_attempts[good] == 1 and good in me.prober.links, me.prober.probe_attempts

    heartbeats = me.publishes["heartbeat"]
    assert heartbeats <= RUN_S / (TTL_S / 2) + 1, me.publishes
    assert me.publishes["probe"] <= 2, me.publishes  # `ready` after the first round; the link to `good`
    assert me.publishes.total() <= heartbeats + 4, me.publishes  # + start and leaving


@pytest.mark.parametrize("base_s, max_s", [(0.0, 10.0), (20.0, 10.0)])
def test_a_backoff_that_could_spin_or_never_grow_is_refused(base_s: float, max_s: float):
    with pytest.raises(ConfigError, match="probe_backoff_s"):
        VolunteerConfig(probe_backoff_s=base_s, probe_backoff_max_s=max_s)


class _Refusing:
    """A record store whose first `times` stores no DHT node takes (a loaded swarm), and that notes when each came."""

    def __init__(self, times: int) -> None:
        self.times, self.stores = times, []

    async def publish(self, record: PeerRecord, *, ttl_s: float) -> bool:
        self.stores.append(asyncio.get_running_loop().time())
        return len(self.stores) > self.times


def heartbeat_gaps(refused: int, *, news_at_s: float | None = None, run_s: float = 5.0) -> list[float]:
    """Seconds between the stores of a heartbeat with T = 4 s (every 2 s) over `run_s`, the first `refused` stores
    refused; with `news_at_s`, the record is also published that long after the start, as after a probe round."""
    records = _Refusing(refused)
    node = SimpleNamespace(peer_id=IDS[0], records=records, config=SimpleNamespace(swarm=SWARM),
                           dht=SimpleNamespace(get_visible_maddrs=lambda: []))
    volunteer = Volunteer(node, HARDWARE, VolunteerConfig(ttl_s=4.0))

    async def news() -> None:
        await asyncio.sleep(news_at_s)
        await volunteer.publish_record("probe")

    async def beat() -> float:
        started = asyncio.get_running_loop().time()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(run_s), asyncio.TaskGroup() as tasks:
                tasks.create_task(volunteer._heartbeat())
                if news_at_s is not None:
                    tasks.create_task(news())
        return started

    started = asyncio.run(beat())
    return [b - a for a, b in zip([started, *records.stores], records.stores)]


@pytest.mark.timing  # measures the gaps between heartbeats
def test_a_refused_heartbeat_is_tried_again_within_a_second_not_a_period_later():
    gaps = heartbeat_gaps(refused=1)
    assert len(gaps) == 3, gaps  # refused at 2 s, taken at 2.4 s, refreshed at 4.4 s
    assert gaps == pytest.approx([2.0, 0.4, 2.0], abs=0.3), gaps


@pytest.mark.timing  # measures the gaps between heartbeats
def test_refused_heartbeats_back_off_up_to_a_sixth_of_the_ttl_so_an_overloaded_dht_is_not_asked_every_second():
    gaps = heartbeat_gaps(refused=3)
    assert len(gaps) == 4, gaps  # refused at 2, 2.4 and 3.07 s, taken at 3.73 s; the next heartbeat at 5.73 s
    assert gaps == pytest.approx([2.0, 0.4, 4.0 / 6, 4.0 / 6], abs=0.15), gaps


@pytest.mark.timing  # measures the gaps between stores
def test_a_refused_store_of_news_is_tried_again_within_a_second_not_at_the_next_heartbeat():
    """New links are what a coordinator holding its plan back waits for (coordinator/measurement_wait.py)."""
    gaps = heartbeat_gaps(refused=1, news_at_s=0.5, run_s=3.5)
    assert len(gaps) == 3, gaps  # the news refused at 0.5 s, taken at 0.9 s, refreshed at 2.9 s
    assert gaps == pytest.approx([0.5, 0.4, 2.0], abs=0.3), gaps


class _ReadOnDemand:
    """A record store whose read of the peers' records returns, with `newcomer`'s, only once asked for."""

    def __init__(self, newcomer: str) -> None:
        self.newcomer, self.reads = newcomer, 0

    async def read_expiring(self, field: str, prefer=(), beam_size=None) -> dict[str, tuple[PeerRecord, float]]:
        assert field == PEERS_FIELD
        self.reads += 1
        return {} if self.reads == 1 else {self.newcomer: (make_record(self.newcomer), get_dht_time() + 60.0)}


def test_a_probe_from_a_peer_not_yet_in_view_waits_for_one_read_and_a_strangers_next_probe_does_not():
    """A newcomer probes us as soon as it sees our record, maybe before our view has its; the probe handler
    (ProbeServicer's `look_for`) then has the records read once more rather than refuse at once; a caller that is
    still not in view afterwards is refused without another wait for a while."""
    records = _ReadOnDemand(IDS[1])
    node = SimpleNamespace(peer_id=IDS[0], records=records, sites={})
    volunteer = Volunteer(node, HARDWARE, VolunteerConfig(view_interval_s=60.0))  # no read but on demand

    async def scenario() -> None:
        watch = asyncio.create_task(volunteer._watch())
        try:
            async with asyncio.timeout(10):
                while records.reads < 1:
                    await asyncio.sleep(0.01)
                assert IDS[1] not in volunteer.peers
                await volunteer._look_for(IDS[1])
                assert IDS[1] in volunteer.peers and records.reads == 2
                await volunteer._look_for(IDS[2])  # never in view: waits for one more read
                assert records.reads == 3
                await volunteer._look_for(IDS[2])  # and is not waited for again
                assert records.reads == 3
        finally:
            watch.cancel()

    asyncio.run(scenario())


class _Reads:
    """A record store whose reads of the peers' records return the given views in turn, then the last one."""

    def __init__(self, *views: dict[str, PeerRecord]) -> None:
        self.views, self.reads = views, 0

    async def read_expiring(self, field: str, prefer=(), beam_size=None) -> dict[str, tuple[PeerRecord, float]]:
        view = self.views[min(self.reads, len(self.views) - 1)]
        self.reads += 1
        return {peer: (record, get_dht_time() + 60.0) for peer, record in view.items()}


def test_a_read_that_misses_a_peer_keeps_it_in_view_and_a_leaving_record_takes_it_out():
    """At 32 clients on one machine, reads of the busy DHT gave a volunteer views of 22, 14, 7 and 5 peers within
    a minute: it forgot its measurements of the missed peers and probed them again past its budget."""
    a, b = (make_record(peer) for peer in IDS[1:3])
    leaving = b.copy(update={"state": "leaving", "updated_at": b.updated_at + 1})
    records = _Reads({a.peer_id: a, b.peer_id: b}, {a.peer_id: a}, {a.peer_id: a, b.peer_id: leaving})
    node = SimpleNamespace(peer_id=IDS[0], records=records, sites={})
    volunteer = Volunteer(node, HARDWARE, VolunteerConfig(view_interval_s=60.0))  # no read but on demand

    async def scenario() -> list[set[str]]:
        watch = asyncio.create_task(volunteer._watch())
        try:
            async with asyncio.timeout(10):
                while volunteer._views < 1:
                    await asyncio.sleep(0.01)
                views = [set(volunteer.peers)]
                for stranger in IDS[5:7]:  # a call from a peer not in view has the records read once more
                    await volunteer._look_for(stranger)
                    views.append(set(volunteer.peers))
        finally:
            watch.cancel()
        return views

    assert asyncio.run(scenario()) == [{a.peer_id, b.peer_id}, {a.peer_id, b.peer_id}, {a.peer_id}]


@pytest.mark.parametrize("max_links", [MAX_LINKS_PER_RECORD, VolunteerConfig().max_links])
def test_a_volunteer_that_measured_more_links_than_a_record_holds_publishes_the_newest(max_links):
    node = SimpleNamespace(peer_id=IDS[0], records=None, config=SimpleNamespace(swarm=SWARM),
                           dht=SimpleNamespace(get_visible_maddrs=lambda: []))
    volunteer = Volunteer(node, HARDWARE, VolunteerConfig(max_links=max_links))
    peers = [f"Qm{index:044d}".translate(str.maketrans("0123456789", "abcdefghij"))  # base58 has no 0
             for index in range(MAX_LINKS_PER_RECORD + 44)]
    volunteer.prober.links = {
        peer: LinkMeasurement(latency_ms=10.0, bandwidth_mbps=100.0, measured_at=float(at), samples=3)
        for at, peer in enumerate(peers)}
    record = volunteer.record()  # validated: it used to fail on its own record past the limit
    assert sorted(record.links) == sorted(peers[-max_links:])  # rotated-out links give way to the newest


@pytest.mark.swarm
def test_past_its_budget_each_volunteer_measures_its_share_and_no_pair_twice(tmp_path):
    """Five volunteers that may each measure two links (protocol/measurement_policy.py): the records stay within
    the budget, the smaller id alone measures a pair, and the coordinator estimates the rest from them."""
    names = [f"v{i}" for i in range(5)]
    ids = identities(tmp_path, names)
    first, _ = start_node(SWARM, ids["v0"].path)
    dhts = [first]
    try:
        config = NodeConfig(swarm=SWARM, initial_peers=tuple(str(m) for m in first.get_visible_maddrs()),
                            host_maddrs=(LOOPBACK,))
        nodes = {"v0": (config, first, ids["v0"])}
        for name in names[1:]:
            dhts.append(start_dht(config, ids[name]))
            nodes[name] = (config, dhts[-1], ids[name])
        budget = replace(CONFIG, max_links=2, reprobe_s=1e6)  # one epoch for the whole run
        volunteers = asyncio.run(run_volunteers(nodes, 8.0, budget))
        records = {v.node.peer_id: v.record().copy(update={"state": "ready"})  # as they were before they stopped
                   for v in volunteers.values()}
    finally:
        for dht in reversed(dhts):
            dht.shutdown()

    for me, record in records.items():
        assert len(record.links) <= 2 and len(volunteers_probes(volunteers, me)) <= 2, record.links  # also while
        # the view grew, which shifts the chosen links
        assert all(me < other for other in record.links)  # the smaller id measures
    measured = {frozenset((me, other)) for me, record in records.items() for other in record.links}
    assert 0 < len(measured) < 10, measured  # fewer than all ten pairs, and never one measured from both ends
    view = build_view(records)
    assert len(view.estimated) == 10 - len(measured) and np.isfinite(view.network.latency_ms).all()


def volunteers_probes(volunteers: dict[str, Volunteer], peer_id: str) -> dict[str, int]:
    return next(v.prober.probe_attempts for v in volunteers.values() if v.node.peer_id == peer_id)


@pytest.mark.swarm
def test_links_the_coordinator_asks_for_are_measured_and_a_strangers_requests_are_not(tmp_path):
    """Seven volunteers that may each measure two links, pinned to a coordinator: once their first round is in, the
    coordinator asks for two pairs nobody measured (protocol/records.py: LinkRequests) and a stranger for a third;
    the end the coordinator names measures each of its pairs, beyond its epoch's budget (for the second pair the
    larger id, which the policy never has measure it), and the stranger's pair stays unmeasured."""
    names = [f"v{i}" for i in range(7)]
    ids = identities(tmp_path, names)
    first, coordinator = start_node(SWARM, tmp_path / "coordinator.key")
    stranger, stranger_key = start_node(SWARM, tmp_path / "stranger.key", [str(m) for m in first.get_visible_maddrs()])
    dhts = [first, stranger]
    asked: list[tuple[str, str]] = []

    async def ask(volunteers: dict[str, Volunteer]) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30.0
        while loop.time() < deadline and any(len(v.peers) < len(names) - 1 for v in volunteers.values()):
            await asyncio.sleep(0.5)
        await asyncio.sleep(3.0)  # the first round on the whole view: every volunteer probed what its draw chose
        measured = {frozenset((v.node.peer_id, other)) for v in volunteers.values() for other in v.prober.links}
        unmeasured = [pair for pair in itertools.combinations(sorted(v.node.peer_id for v in volunteers.values()), 2)
                      if frozenset(pair) not in measured]
        triple = next((pairs for pairs in itertools.combinations(unmeasured, 3)  # no peer in two of them
                       if len(set(itertools.chain(*pairs))) == 6), None)
        assert triple is not None, measured
        asked.extend((triple[0], triple[1][::-1], triple[2]))  # as (measurer, target)
        for dht, key, pairs in ((first, coordinator, asked[:2]), (stranger, stranger_key, asked[2:])):
            requests = LinkRequests(coordinator_id=peer_id_of(key.get_public_key()), pairs=pairs,
                                    updated_at=get_dht_time())
            assert await SwarmRecords(dht, SWARM, private_key=key).publish(requests, ttl_s=60.0)
        deadline = loop.time() + 20.0
        while loop.time() < deadline and not all(
                b in volunteers_of(volunteers, a).prober.links for a, b in asked[:2]):
            await asyncio.sleep(0.5)
        await asyncio.sleep(2.0)  # time enough for the stranger's pair too, were it taken

    try:
        config = NodeConfig(swarm=SWARM, initial_peers=tuple(str(m) for m in first.get_visible_maddrs()),
                            host_maddrs=(LOOPBACK,))
        nodes = {}
        for name in names:
            dhts.append(start_dht(config, ids[name]))
            nodes[name] = (config, dhts[-1], ids[name])
        budget = replace(CONFIG, max_links=2, reprobe_s=1e6, coordinator=peer_id_of(coordinator.get_public_key()))
        volunteers = asyncio.run(run_volunteers(nodes, 0.0, budget, during=ask))
    finally:
        for dht in reversed(dhts):
            dht.shutdown()
    for a, b in asked[:2]:
        assert b in volunteers_of(volunteers, a).prober.links, (a, b)
        assert volunteers_of(volunteers, a).prober.asked == {b}
    low, high = asked[2]
    assert high not in volunteers_of(volunteers, low).prober.links
    assert volunteers_of(volunteers, low).prober.asked == frozenset()


def volunteers_of(volunteers: dict[str, Volunteer], peer_id: str) -> Volunteer:
    return next(v for v in volunteers.values() if v.node.peer_id == peer_id)
