"""Loss spikes are found against the recent median, once each, and a rollback forgets the losses it undoes."""
from __future__ import annotations

import pytest

from hetswarm.client.training.progress_report import recordable_loss
from hetswarm.coordinator.loss_watch import LossWatch
from hetswarm.coordinator.state_plan import rollback_state
from hetswarm.protocol.errors import ConfigError
from hetswarm.protocol.limits import MAX_LOSS
from hetswarm.protocol.records import CheckpointInfo, Progress
from tests.helpers.plans import plan
from tests.helpers.swarm_records import IDS, record


def _losses(assignment, losses: dict[int, float], signer: str | None = None) -> list[dict[str, Progress]]:
    peers = [signer] if signer else [chain[-1] for chain in assignment.pipelines]
    return [{peer: Progress(peer_id=peer, assignment_version=assignment.version, step=step, loss=loss,
                            tokens_per_s=1.0, compute_s=0.1, wait_s=0.0, updated_at=0.0) for peer in peers}
            for step, loss in losses.items()]


def _watch(assignment, losses: dict[int, float], **config) -> LossWatch:
    watch = LossWatch(**config)
    for reports in _losses(assignment, losses):
        watch.observe(assignment, reports)
    return watch


def test_a_spike_is_found_against_the_recent_median_and_a_falling_curve_is_not_one():
    assignment = plan()
    falling = {step: 5.5 * 0.97 ** step for step in range(40)}
    assert _watch(assignment, falling).spike() is None
    spiked = falling | {30: 9.0}
    spike = _watch(assignment, spiked).spike()
    assert spike is not None and spike.step == 30 and spike.loss == 9.0 and spike.last_good == 29
    assert "loss spike at step 30" in spike.describe()
    assert _watch(assignment, spiked, threshold=0).spike() is None  # turned off


def test_a_settled_spike_is_not_judged_again_and_a_rollback_forgets_the_undone_losses():
    assignment = plan()
    watch = _watch(assignment, {step: 3.0 for step in range(20)} | {20: 12.0})
    spike = watch.spike()
    watch.settle(spike, rolled_back_to=16)
    assert watch.spike() is None
    for reports in _losses(assignment, {16: 3.0, 17: 3.0, 18: 3.0, 19: 3.0, 20: 12.0, 21: 3.0}):
        watch.observe(assignment, reports)
    assert watch.spike() is None  # the same data brought the same spike: a property of the run, not a fault
    for reports in _losses(assignment, {22: 30.0}):
        watch.observe(assignment, reports)
    assert watch.spike().step == 22


def test_only_the_plans_members_losses_count():
    assignment = plan()
    watch = _watch(assignment, {step: 3.0 for step in range(20)})
    for reports in _losses(assignment, {20: 100.0}, signer=IDS[8]):  # a stranger's Progress
        watch.observe(assignment, reports)
    assert watch.spike() is None


def test_one_members_word_cannot_force_a_rollback_but_two_pipelines_or_a_lone_one_can():
    """A last-stage member that reports a spike of its own pipeline alone is outvoted; a first-stage member's loss
    (it computes none) is not read; a plan of one pipeline rolls back on its only one."""
    assignment = plan()  # 2 pipelines
    normal = {step: 3.0 for step in range(20)}
    liar = assignment.pipelines[0][-1]
    watch = _watch(assignment, normal)
    for reports in _losses(assignment, {20: 100.0}, signer=liar):
        watch.observe(assignment, reports)
    for reports in _losses(assignment, {21: 100.0}, signer=assignment.pipelines[1][0]):  # a first stage
        watch.observe(assignment, reports)
    assert watch.spike() is None
    for reports in _losses(assignment, {20: 100.0}, signer=assignment.pipelines[1][-1]):  # the other pipeline too
        watch.observe(assignment, reports)
    assert watch.spike().step == 20
    single = plan(d_dp=1)
    alone = _watch(single, normal | {20: 100.0})
    assert alone.spike().step == 20


def test_a_rollback_goes_to_the_newest_complete_checkpoint_before_the_spike():
    a, b = IDS[:2]
    records = {a: record(a).copy(update={"checkpoints": [CheckpointInfo(step=s, layers=[0, 2]) for s in (8, 12, 16)]}),
               b: record(b).copy(update={"checkpoints": [CheckpointInfo(step=s, layers=[2, 4]) for s in (8, 12)]})}
    origin = rollback_state(records, {a, b}, 4, before=16, why="loss spike")
    assert origin.step == 12 and origin.handoff.resumed_from_checkpoint and origin.handoff.sources == [a, b]
    assert "rolled back to the checkpoints of step 12" in origin.note
    assert rollback_state(records, {a, b}, 4, before=8, why="x") is None


def test_a_spike_threshold_at_or_below_one_is_refused():
    with pytest.raises(ConfigError):
        LossWatch(threshold=1.0)


def test_checkpoints_of_an_abandoned_trajectory_are_never_resumed_from():
    """After a plan (v5) went back to step 8, the step-12 checkpoints written under v3 are of the future it abandoned;
    one written again under v5 is fine."""
    a, b = IDS[:2]
    old = [CheckpointInfo(step=s, layers=[0, 2], plan_version=3) for s in (8, 12)]
    records = {a: record(a).copy(update={"checkpoints": old}),
               b: record(b).copy(update={"checkpoints": [CheckpointInfo(step=s, layers=[2, 4], plan_version=3)
                                                         for s in (8, 12)]})}
    assert rollback_state(records, {a, b}, 4, before=20, why="x").step == 12
    assert rollback_state(records, {a, b}, 4, before=20, why="x", abandoned=[(8, 5)]).step == 8
    again = {p: r.copy(update={"checkpoints": [CheckpointInfo(step=12, layers=r.checkpoints[0].layers, plan_version=5)]})
             for p, r in records.items()}
    assert rollback_state(again, {a, b}, 4, before=20, why="x", abandoned=[(8, 5)]).step == 12


@pytest.mark.parametrize("loss", [float("nan"), float("inf"), -1.0, 10 * MAX_LOSS])
def test_a_loss_a_record_cannot_hold_is_published_as_the_worst_it_can_so_the_loss_watch_sees_it(loss):
    """It used to make the trainer fail on its own Progress record: the swarm never learnt of the divergence."""
    assert recordable_loss(loss, step=3) == MAX_LOSS
    assert recordable_loss(2.5, step=3) == 2.5 and recordable_loss(None, step=3) is None
    Progress(peer_id=IDS[0], assignment_version=1, step=3, loss=recordable_loss(loss, step=3), tokens_per_s=1.0,
             compute_s=0.1, wait_s=0.0, updated_at=0.0)  # a record that validates
