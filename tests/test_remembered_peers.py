"""The coordinator tells "gone" from "not read" (protocol/remembered_peers.py): a read that misses a record does
not remove its peer; its record's expiry, or a newer record of it that says it is leaving, does. A volunteer in a
big swarm reads less often, never so seldom that one missed read drops a live peer, and polls the plan less often
while it stands by (client/peer/volunteer.py)."""
from __future__ import annotations

from dataclasses import replace

from hetswarm.client.peer.volunteer import MAX_STANDBY_POLL_S, VolunteerConfig, follow_wait_s, view_wait_s
from hetswarm.coordinator.planner import PlannerConfig
from hetswarm.coordinator.replanner import Replanner
from hetswarm.coordinator.swarm_view import trainable_peers
from hetswarm.protocol.remembered_peers import RememberedPeers
from tests.helpers.plans import MODEL, PEERS, SEARCH, Publishing, measured_records
from tests.helpers.swarm_records import IDS

TTL = 60.0


def read(records: dict, *, at: float, only=None, state: str = "ready") -> dict:
    """What a read at DHT time `at` returns of `records` (of `only` those peers): refreshed then, expiring a TTL
    later."""
    return {peer: (r.copy(update={"updated_at": at, "state": state}), at + TTL)
            for peer, r in records.items() if only is None or peer in only}


def test_a_read_that_misses_a_record_keeps_its_peer_until_the_record_expires():
    records, memory = measured_records(IDS[:4]), RememberedPeers()
    assert set(memory.merge(read(records, at=0.0), now=0.0)) == set(IDS[:4])
    partial = memory.merge(read(records, at=10.0, only=IDS[:2]), now=10.0)  # a busy DHT answered for two
    assert set(partial) == set(IDS[:4])
    assert set(memory.merge({}, now=59.0)) == set(IDS[:4])  # an empty read (no node answered in time) likewise
    assert set(memory.merge({}, now=61.0)) == set(IDS[:2])  # the two not refreshed since 0 expired: gone


def test_a_newer_record_replaces_an_older_one_and_a_leaving_peer_is_not_planned():
    records, memory = measured_records(IDS[:3]), RememberedPeers()
    memory.merge(read(records, at=5.0), now=5.0)
    view = memory.merge(read(records, at=1.0, only=[IDS[0]], state="leaving"), now=6.0)  # older: ignored
    assert view[IDS[0]].state == "ready"
    view = memory.merge(read(records, at=7.0, only=[IDS[0]], state="leaving"), now=7.0)
    assert view[IDS[0]].state == "leaving" and trainable_peers(view) == IDS[1:3]


def test_the_plan_survives_a_partial_read_and_loses_a_peer_only_when_its_record_expires():
    planner = Publishing(Replanner(PlannerConfig(model=MODEL, d_pp=2, search=SEARCH, min_peers=4, debounce_s=5.0)))
    records, memory = measured_records(PEERS), RememberedPeers()
    assert planner.decide(memory.merge(read(records, at=0.0), now=0.0), now=0.0) is None
    first, _ = planner.decide(memory.merge(read(records, at=5.0), now=5.0), now=5.0)
    for at in (10.0, 20.0, 30.0):  # a quarter of the swarm missing from each read: nobody left
        assert planner.decide(memory.merge(read(records, at=at, only=PEERS[:3]), now=at), now=at) is None
    assert planner.in_force.pricing is first
    gone = PEERS[3]  # last refreshed at 5: expires at 65, then the debounce
    assert planner.decide(memory.merge(read(records, at=66.0, only=PEERS[:3]), now=66.0), now=66.0) is None
    proposal, reason = planner.decide(memory.merge(read(records, at=71.0, only=PEERS[:3]), now=71.0), now=71.0)
    assert reason.startswith("membership changed: 0 joined [], 1 left") and gone not in proposal.peers


def test_reads_of_different_nodes_do_not_add_up_past_the_limit_the_plans_and_the_freshest_stay():
    records = measured_records(IDS[:6])
    memory = RememberedPeers(limit=4)
    memory.merge(read(records, at=1.0, only=IDS[:3]), now=1.0)
    view = memory.merge(read(records, at=2.0, only=IDS[3:]), now=2.0)
    assert len(view) == 4 and set(IDS[3:6]) < set(view)  # the three dated 2 s, and one of those dated 1 s
    memory = RememberedPeers(limit=4)
    memory.merge(read(records, at=1.0, only=IDS[:3]), now=1.0)
    view = memory.merge(read(records, at=2.0, only=IDS[3:]), now=2.0, prefer=IDS[1:3])  # the plan's members first
    assert len(view) == 4 and set(IDS[1:3]) < set(view) and IDS[0] not in view


def test_a_big_swarm_reads_its_records_less_often_yet_twice_within_the_life_of_a_record_read():
    config = VolunteerConfig()  # T = 60 s, records read every 5 s
    assert [view_wait_s(config, peers) for peers in (0, 16, 40, 48, 64, 10_000)] == [5.0, 5.0, 10.0, 12.0, 12.0, 12.0]
    assert 2 * view_wait_s(config, 10_000) < config.ttl_s / 2
    assert view_wait_s(replace(config, view_interval_s=60.0), 64) == 60.0  # a longer interval asked for is kept


def test_standbys_of_a_big_swarm_poll_the_plan_less_often_and_its_members_as_often_as_asked():
    config = VolunteerConfig()  # the plan read every 2 s
    standby = [follow_wait_s(config, peers, placed=False) for peers in (0, 20, 64, 1000)]
    assert standby == [2.0, 2.0, 6.4, MAX_STANDBY_POLL_S]
    assert [follow_wait_s(config, peers, placed=True) for peers in (0, 64, 1000)] == [2.0] * 3
