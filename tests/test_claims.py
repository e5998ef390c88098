"""A peer that claims far more TFLOPS than its reported compute times show is priced by what it does and flagged;
honest peers, however far a matmul benchmark is from a training step, are left alone (coordinator/claims.py)."""
from __future__ import annotations

import pytest

from hetswarm.coordinator.claims import ClaimCheck
from hetswarm.protocol.records import Progress
from tests.helpers.swarm_records import record
from tests.test_coordinator_restart import plan


def _reports(assignment, seconds: dict[str, float], step: int) -> dict[str, Progress]:
    return {peer: Progress(peer_id=peer, assignment_version=assignment.version, step=step, loss=None,
                           tokens_per_s=1.0, compute_s=s, wait_s=0.0, updated_at=0.0) for peer, s in seconds.items()}


def test_a_peer_claiming_a_hundred_times_its_compute_is_priced_by_what_it_does():
    assignment = plan()
    peers = sorted(assignment.roles)
    liar = peers[0]
    records = {p: record(p, tflops=100.0 if p == liar else 1.0) for p in peers}
    check = ClaimCheck()
    for step in range(1, 5):  # every peer takes the same time: all compute alike, whatever they claim
        check.observe(assignment, _reports(assignment, {p: 0.2 for p in peers}, step))
        check.observe(assignment, _reports(assignment, {p: 0.2 for p in peers}, step))  # read twice, counted once
    judged, flagged = check.judge(records)
    assert set(flagged) == {liar} and "claims 100 TFLOPS" in flagged[liar]
    assert judged[liar].hardware.tflops == pytest.approx(1.0, rel=0.5)  # about what its neighbours achieve
    assert all(judged[p] == records[p] for p in peers if p != liar)


def test_honest_peers_of_different_speeds_are_not_flagged_and_too_few_reports_judge_nobody():
    assignment = plan()
    peers = sorted(assignment.roles)
    speeds = dict(zip(peers, [1.0, 2.0, 4.0, 8.0]))
    records = {p: record(p, tflops=speeds[p]) for p in peers}
    check = ClaimCheck()
    check.observe(assignment, _reports(assignment, {p: 0.4 / speeds[p] for p in peers}, 1))
    assert check.judge(records) == (records, {})  # one report each: not enough to judge
    for step in range(2, 5):
        check.observe(assignment, _reports(assignment, {p: 0.4 / speeds[p] for p in peers}, step))
    assert check.judge(records) == (records, {})  # faster peers do their claims' worth: nobody is flagged
