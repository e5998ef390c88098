"""Plans made the way the coordinator makes them, from records made by hand: for the tests of what the coordinator
and the clients do with a plan."""
from __future__ import annotations

import functools

from hetswarm.client.peer.emulation import SiteLinks
from hetswarm.coordinator.assignment_record import build_assignment
from hetswarm.coordinator.plan_in_force import PlanInForce
from hetswarm.coordinator.planner import PlannerConfig, Proposal, propose
from hetswarm.coordinator.replanner import Replanner
from hetswarm.coordinator.scheduling.search import SearchConfig
from hetswarm.coordinator.swarm_view import build_view
from hetswarm.protocol.model_config import get_model_config
from hetswarm.protocol.records import Assignment, PeerRecord
from tests.helpers.swarm_records import IDS, link, record

MODEL = get_model_config("tiny")
SEARCH = SearchConfig(time_budget_s=2.0)
SITES = ["Oregon", "Virginia", "Ohio", "Tokyo", "Seoul", "London", "Frankfurt", "Ireland"]
LINKS = SiteLinks.from_scenario("worldwide", bandwidth_scale=0.05)
COORDINATOR = IDS[9]
PEERS = IDS[:4]


def worldwide_records(n: int = 8, *, slow: set[frozenset[str]] = frozenset(), memory_gib: float = 4.0,
                      tflops: float = 1.0) -> dict:
    """n peers at the scenario's sites, every pair measured; pairs in `slow` are 20× slower."""
    peers = IDS[:n]
    records = {}
    for i, peer in enumerate(peers):
        links = {}
        for j, other in enumerate(peers[i + 1:], start=i + 1):
            latency_ms, bandwidth_mbps = LINKS.link(SITES[i], SITES[j])
            factor = 20.0 if frozenset((peer, other)) in slow else 1.0
            links[other] = link(latency_ms * factor, bandwidth_mbps / factor)
        records[peer] = record(peer, site=SITES[i], links=links, memory_gib=memory_gib, tflops=tflops)
    return records


def measured_records(peers: list[str], *, following: int | None = None) -> dict[str, PeerRecord]:
    """Ready peers with every link measured (10 ms, 1 Gbit/s); `following`: the version each says it follows."""
    return {p: record(p, links={q: link(10.0, 1000.0) for q in peers if q > p}).copy(
        update={"assignment_version": following}) for p in peers}


@functools.cache
def scheduled(d_dp: int, d_pp: int) -> Proposal:
    return propose(build_view(measured_records(PEERS)), PlannerConfig(
        model=MODEL, d_dp=d_dp, d_pp=d_pp, search=SearchConfig(time_budget_s=0.5)))


def plan(version: int = 7, step: int = 5, *, d_dp: int = 2, d_pp: int = 2) -> Assignment:
    """An assignment of PEERS as the coordinator would publish it."""
    return build_assignment(scheduled(d_dp, d_pp), coordinator_id=COORDINATOR, version=version, reason="test",
                            step=step)


class Publishing:
    """A replanner whose every decision is published at once, as the coordinator's loop does when every placed peer
    answers and the state is found (coordinator/broadcaster.py): each round it is handed the plan in force."""

    def __init__(self, replanner: Replanner, in_force: PlanInForce | None = None) -> None:
        self.replanner, self.in_force = replanner, in_force

    def decide(self, records: dict[str, PeerRecord], now: float) -> tuple[Proposal, str] | None:
        decision = self.replanner.decide(records, now, in_force=self.in_force)
        if decision is not None:
            proposal, reason = decision
            version = self.in_force.assignment.version + 1 if self.in_force is not None else 1
            assignment = build_assignment(proposal, coordinator_id=COORDINATOR, version=version, reason=reason, step=0)
            self.in_force = PlanInForce(assignment=assignment, origin="this run", pricing=proposal)
        return decision

    def note_trouble(self, **trouble) -> None:
        self.replanner.note_trouble(**trouble)

    def left_out(self, now: float) -> dict[str, str]:
        return self.replanner.left_out(now)
