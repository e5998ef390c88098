"""The coordinator tells "gone" from "not read" (protocol/remembered_peers.py): a read that misses a record does
not remove its peer; its record's expiry, or a newer record of it that says it is leaving, does."""
from __future__ import annotations

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
