"""Where a new plan's state comes from (coordinator/state_plan.py): a hand-off from the survivors, a resume from
the newest complete checkpoint, a wait, or lost layers that start again from the seed."""
from __future__ import annotations

from hetswarm.coordinator.state_plan import checkpoint_plan, layer_ranges, plan_state
from hetswarm.protocol.records import CheckpointInfo, PeerRecord, Progress
from tests.helpers.swarm_records import IDS, record
from tests.test_training_correctness import TINY, _assignment

A, B, C, D, E = IDS[:5]
PIPELINES = [[A, B], [C, D]]  # stage 0: A and C (layers 0-1), stage 1: B and D (layers 2-3)
PREVIOUS = _assignment(PIPELINES, IDS[9]).copy(update={"version": 4, "step": 10})


def peers(*alive: str, checkpoints: dict[str, list[tuple[int, tuple[int, int]]]] | None = None) -> dict:
    records: dict[str, PeerRecord] = {}
    for peer in alive:
        held = [CheckpointInfo(step=step, layers=list(layers)) for step, layers in (checkpoints or {}).get(peer, [])]
        records[peer] = record(peer).copy(update={"checkpointing": bool(held), "checkpoints": held})
    return records


def stalled(peer: str) -> Progress:
    return Progress(peer_id=peer, assignment_version=4, step=30, loss=None, tokens_per_s=0.0, compute_s=0.0,
                    wait_s=0.0, health="stalled", reason="test", updated_at=0.0)


def decide(alive: dict, *, progress: dict | None = None, give_up: bool = False, previous=PREVIOUS, live_step=30):
    return plan_state(previous=previous, live_step=live_step, alive=set(alive), records=alive,
                      progress=progress or {}, n_layers=TINY.n_layers, give_up=give_up)


def test_survivors_that_cover_every_layer_hand_the_state_off():
    origin = decide(peers(A, D, E))  # B and C are gone; A holds stage 0 and D stage 1
    assert origin.step == 30 and origin.handoff.sources == [A, D] and not origin.handoff.resumed_from_checkpoint
    assert origin.note == ""


def test_a_stage_without_survivors_resumes_from_the_newest_complete_checkpoint():
    checkpoints = {A: [(28, (0, 2)), (24, (0, 2))], E: [(24, (2, 4)), (20, (2, 4))]}
    origin = decide(peers(A, C, E, checkpoints=checkpoints))  # stage 1 (B, D) is gone; 28 is not complete
    assert origin.step == 24 and origin.handoff.resumed_from_checkpoint and origin.handoff.sources == [A, E]
    assert origin.note == "resumed from the checkpoints of step 24 (no live replica of layers 2-3)"


def test_lost_layers_wait_for_a_holder_then_start_again_from_the_seed():
    waiting = decide(peers(A, C, E))
    assert isinstance(waiting, str) and "layers 2-3 have no live replica and no checkpoint" in waiting
    origin = decide(peers(A, C, E), give_up=True)
    assert origin.step == 30 and origin.handoff.seeded_layers == [[2, 4]] and origin.handoff.sources == [A, C]
    assert "start again from the seed" in origin.note


def test_a_member_that_gave_up_is_no_holder():
    origin = decide(peers(A, B, C), progress={B: stalled(B)}, give_up=True)  # D gone, B stalled: stage 1 lost
    assert origin.handoff.seeded_layers == [[2, 4]] and B not in origin.handoff.sources


def test_a_fresh_run_resumes_from_checkpoints_if_any_else_starts_from_the_seed():
    checkpoints = {A: [(40, (0, 2))], B: [(40, (2, 4))]}
    resumed = decide(peers(A, B, checkpoints=checkpoints), previous=None, live_step=0)
    assert resumed.step == 40 and resumed.handoff.resumed_from_checkpoint and "a fresh start" in resumed.note
    fresh = decide(peers(A, B), previous=None, live_step=0)
    assert fresh.step == 0 and fresh.handoff is None


def test_one_saver_per_stage_the_lowest_id_that_keeps_checkpoints():
    records = peers(A, B, C, D, checkpoints={C: [(4, (0, 2))], D: [(4, (2, 4))], B: [(4, (2, 4))]})
    plan = checkpoint_plan(PIPELINES, records, every=10)
    assert plan.savers == [C, B] and plan.every == 10
    assert checkpoint_plan(PIPELINES, peers(A, B, C, D), every=10) is None


def test_layer_ranges():
    assert layer_ranges({0, 1, 3, 5, 6}) == [(0, 2), (3, 4), (5, 7)] and layer_ranges(set()) == []
