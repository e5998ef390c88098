"""A peer that claims far more TFLOPS than its reported compute times show is priced by what it does and flagged;
honest peers, however far a matmul benchmark is from a training step, are left alone, unless one computes unlike its
claim by more than the trust band; a claim far over the median waits on probation until its pipeline neighbours'
timings confirm it, so a stranger's 10,000 TFLOPS buys it nothing in a fresh swarm, whatever compute times it reports
(coordinator/claims.py)."""
from __future__ import annotations

import pytest

from hetswarm.coordinator.claims import ClaimCheck
from hetswarm.coordinator.planner import PlannerConfig, propose
from hetswarm.coordinator.scheduling.live_cost import Execution, StageCosts
from hetswarm.coordinator.swarm_view import build_view
from hetswarm.protocol.records import Progress
from tests.helpers.plans import MODEL, SEARCH, plan, worldwide_records
from tests.helpers.swarm_records import record


def _reports(assignment, seconds: dict[str, float], step: int, timings: dict[str, dict] | None = None
             ) -> dict[str, Progress]:
    """Each peer's Progress at `step`: its compute `seconds`, and its neighbour `timings` (window_s, round_trip_s)."""
    return {peer: Progress(peer_id=peer, assignment_version=assignment.version, step=step, loss=None,
                           tokens_per_s=1.0, compute_s=s, wait_s=0.0, updated_at=0.0, **(timings or {}).get(peer, {}))
            for peer, s in seconds.items()}


def _stage_flops(assignment) -> list[float]:
    execution = Execution.of_assignment(assignment)
    costs = StageCosts.of(assignment.model_config(), execution, d_dp=assignment.d_dp)
    return [float(f) for f in costs.at(costs.flops, execution.layer_counts)]


def _one_liar(claims: float, seconds: float) -> tuple[list[str], str, dict, dict, dict]:
    """Four members that each report 0.2 s of compute for four steps, every record read twice, but the first, the
    liar, who claims `claims` TFLOPS and reports `seconds`: the peers, the liar, the records and the judgement."""
    assignment = plan()
    peers = sorted(assignment.roles)
    liar = peers[0]
    records = {p: record(p, tflops=claims if p == liar else 1.0) for p in peers}
    check = ClaimCheck()
    for step in range(1, 5):
        for _ in range(2):  # a record read twice counts once
            check.observe(assignment, _reports(assignment, {p: seconds if p == liar else 0.2 for p in peers}, step))
    judged, flagged = check.judge(records)
    return peers, liar, records, judged, flagged


def test_a_peer_claiming_a_hundred_times_its_compute_is_priced_by_what_it_does():
    peers, liar, records, judged, flagged = _one_liar(100.0, 0.2)  # all compute alike, whatever they claim
    assert set(flagged) == {liar} and "claims 100 TFLOPS" in flagged[liar]
    assert judged[liar].hardware.tflops == pytest.approx(1.0, rel=0.5)  # about what its neighbours achieve
    assert all(judged[p] == records[p] for p in peers if p != liar)


def test_claims_far_over_the_median_wait_on_probation_until_their_neighbours_timings_confirm_them():
    """Four members whose reports match their claims (1, 2, 4 and 8 TFLOPS, all equally efficient): the fastest
    stays on probation while it has too few steps, and while its upstream neighbour's round trips show a peer 8×
    slower than its own reports (a liar reports the times its claim implies); a round trip that holds its compute,
    a window of the neighbour after it and a little network is what confirms it."""
    assignment = plan()
    (first, fast), (second, other) = assignment.pipelines  # `fast` is a last stage: timed by `first` alone
    speeds = {first: 1.0, second: 2.0, other: 4.0, fast: 8.0}  # the median claim is 3: past the trust band, 6
    flops = _stage_flops(assignment)
    seconds = {p: flops[assignment.roles[p].stage] / (0.5 * speeds[p] * 1e12) for p in speeds}  # 50 % efficient
    records = {p: record(p, tflops=speeds[p]) for p in speeds}

    def judged_after(steps: range, round_trip_s: float, check: ClaimCheck) -> tuple[dict, dict]:
        for step in steps:
            check.observe(assignment, _reports(assignment, seconds, step, {first: {"round_trip_s": round_trip_s}}))
        return check.judge(records)

    on_its_word = ClaimCheck()
    judged, flagged = judged_after(range(1, 2), 1.1 * seconds[fast], on_its_word)  # one step: too few to judge
    assert {p: judged[p].hardware.tflops for p in speeds} == {**speeds, fast: 3.0}
    assert list(flagged) == [fast] and "on probation: claims 8 TFLOPS" in flagged[fast]
    assert "until its neighbours' timings confirm it" in flagged[fast]
    lied = ClaimCheck()
    judged, flagged = judged_after(range(1, 5), 8 * seconds[fast], lied)  # its neighbour saw it 8× slower
    assert judged[fast].hardware.tflops == 3.0 and list(flagged) == [fast] and fast not in lied.confirmed
    assert judged_after(range(2, 5), 1.1 * seconds[fast], on_its_word) == (records, {})  # shown: nobody flagged
    assert fast in on_its_word.confirmed and first not in on_its_word.confirmed  # a first stage has nobody upstream


def test_a_stranger_claiming_ten_thousand_tflops_in_a_fresh_swarm_is_planned_as_an_ordinary_peer():
    """Taken at its word, the liar gets the whole model under the default auto shape, and the three honest peers
    stand by; on probation it is priced as they are, and the plan is the one of four honest peers."""
    honest = worldwide_records(4)
    liar = sorted(honest)[1]
    lying = {**honest, liar: record(liar, site=honest[liar].site, links=honest[liar].links, tflops=10_000.0)}
    config = PlannerConfig(model=MODEL, search=SEARCH)
    on_its_word = propose(build_view(lying), config)
    assert on_its_word.plan.grid.shape == (1, 1) and list(on_its_word.view.peer_ids) == [liar]
    judged, flagged = ClaimCheck().judge(lying)
    assert judged[liar].hardware.tflops == 1.0 and "on probation: claims 1e+04 TFLOPS" in flagged[liar]
    planned, expected = propose(build_view(judged), config), propose(build_view(honest), config)
    assert planned.plan.grid.shape == expected.plan.grid.shape != (1, 1)
    assert planned.live.total_s == pytest.approx(expected.live.total_s, rel=1e-6)


def test_a_peer_computing_unlike_its_claim_beyond_the_band_is_priced_by_what_it_does_but_not_above_probation():
    """Within `trust_band` of the swarm's efficiency a claim stands (a shared machine's noise moves nobody); a card
    2.4× slower than its figure (throttled, shared) is priced by what it does, at the TFLOPS that would give it the
    swarm's efficiency. One 2.9× faster by its own reports (under-probed, or a liar whose reports suit it) would be
    priced past the trust band over the median claim on its word alone: it waits on probation at the median claim
    until its neighbours' timings confirm it (the hostile swarm's liar did this under load)."""
    assignment = plan()
    slow, noisy, steady, fast = sorted(assignment.roles)
    efficiency = {slow: 0.35, noisy: 0.7, steady: 1.0, fast: 2.5}  # of a 1-TFLOPS claim; the median is 0.85
    flops = _stage_flops(assignment)
    seconds = {p: flops[assignment.roles[p].stage] / (efficiency[p] * 1e12) for p in assignment.roles}
    records = {p: record(p, tflops=1.0) for p in assignment.roles}
    check = ClaimCheck()
    for step in range(1, 5):
        check.observe(assignment, _reports(assignment, seconds, step))
    judged, flagged = check.judge(records)
    assert judged[slow].hardware.tflops == pytest.approx(0.35 / 0.85)
    assert judged[fast].hardware.tflops == 1.0 and fast not in check.confirmed
    assert judged[noisy] == records[noisy] and judged[steady] == records[steady]
    assert set(flagged) == {slow, fast}
    assert "2.4× below" in flagged[slow] and "priced by what it does" in flagged[slow]
    assert "but computes like" not in flagged[slow]
    assert f"on probation: claims 1 TFLOPS, {2.5 / 0.85:.3g} by its own reports" in flagged[fast]


def test_compute_times_no_device_could_have_are_not_measurements_and_their_peer_is_priced_at_the_median_claim():
    peers, liar, records, judged, flagged = _one_liar(10_000.0, 5e-324)
    assert set(flagged) == {liar} and "beyond any device" in flagged[liar]
    assert judged[liar].hardware.tflops == 1.0  # the median claim, not the 10,000 it says
    assert all(judged[p] == records[p] for p in peers if p != liar)


def test_the_whole_model_goes_to_fewer_than_min_trusted_peers_only_once_their_claims_are_confirmed():
    """A fast GPU that would rightly take the whole model alone gets it once its reports confirm its speed; until
    then (a claim nothing has checked yet, even priced as it says) the plan spreads over `min_trusted` peers."""
    records = worldwide_records(4)
    fast = sorted(records)[1]
    records[fast] = record(fast, site=records[fast].site, links=records[fast].links, tflops=10_000.0)
    view, config = build_view(records), PlannerConfig(model=MODEL, search=SEARCH)
    assert config.min_trusted == 2
    unchecked = propose(view, config, trusted=frozenset())
    assert unchecked.plan.grid.size >= 2 and fast in unchecked.view.peer_ids
    confirmed = propose(view, config, trusted=frozenset({fast}))
    assert confirmed.plan.grid.shape == (1, 1) and list(confirmed.view.peer_ids) == [fast]
    assert propose(view, config).plan.grid.shape == (1, 1)  # outside a coordinator (`hetswarm schedule`): as claimed


def test_a_middle_stage_is_timed_by_its_upstream_neighbours_round_trip_less_its_downstream_neighbours_window():
    """The round trip its upstream neighbour measures holds the downstream neighbour's window too (here 5× the
    member's compute): subtracted, it shows the member's claim; not subtracted, it would not."""
    assignment = plan(d_dp=1, d_pp=3)
    [(before, member, after)] = assignment.pipelines
    flops = _stage_flops(assignment)
    speeds = {peer: 8.0 if peer == member else 1.0 for peer in assignment.roles}
    seconds = {p: flops[assignment.roles[p].stage] / (0.5 * speeds[p] * 1e12) for p in speeds}
    window = 5 * seconds[member]
    check = ClaimCheck()
    for step in range(1, 5):
        check.observe(assignment, _reports(assignment, seconds, step, {
            before: {"round_trip_s": 1.1 * seconds[member] + window}, after: {"window_s": window}}))
    assert check.judge({p: record(p, tflops=speeds[p]) for p in speeds})[1] == {}
    assert member in check.confirmed
