"""Where a new plan's state comes from (coordinator/state_plan.py): a hand-off from the survivors, a resume from
the newest complete checkpoint, a wait, or lost layers that start again from the seed."""
from __future__ import annotations

import pytest
from pydantic.v1 import ValidationError

from hetswarm.coordinator.state_plan import checkpoint_plan, kept_state, layer_ranges, plan_state
from hetswarm.protocol.limits import MAX_LAYERS
from hetswarm.protocol.records import CheckpointInfo, Handoff, PeerRecord, Progress
from tests.helpers.swarm_records import IDS, record
from tests.helpers.tiny_training import TINY, assignment_for

A, B, C, D, E = IDS[:5]
PIPELINES = [[A, B], [C, D]]  # stage 0: A and C (layers 0-1), stage 1: B and D (layers 2-3)
PREVIOUS = assignment_for(PIPELINES, IDS[9]).copy(update={"version": 4, "step": 10})


def peers(*alive: str, checkpoints: dict[str, list[tuple[int, tuple[int, int]]]] | None = None) -> dict:
    records: dict[str, PeerRecord] = {}
    for peer in alive:
        held = [CheckpointInfo(step=step, layers=list(layers)) for step, layers in (checkpoints or {}).get(peer, [])]
        records[peer] = record(peer).copy(update={"checkpointing": bool(held), "checkpoints": held})
    return records


def stalled(peer: str) -> Progress:
    return Progress(peer_id=peer, assignment_version=4, step=30, loss=None, tokens_per_s=0.0, compute_s=0.0,
                    wait_s=0.0, health="stalled", reason="test", updated_at=0.0)


def started(peer: str) -> Progress:
    return Progress(peer_id=peer, assignment_version=4, step=30, loss=None, tokens_per_s=1.0, compute_s=0.1,
                    wait_s=0.1, state_origin="handed off", updated_at=0.0)


def decide(alive: dict, *, progress: dict | None = None, give_up: bool = False, previous=PREVIOUS, live_step=30,
           kept=None):
    return plan_state(previous=previous, live_step=live_step, alive=set(alive), records=alive,
                      progress=progress or {}, n_layers=TINY.n_layers, give_up=give_up, kept=kept)


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


def test_a_member_moved_in_holds_nothing_until_it_says_it_started_its_stage():
    """D was moved into stage 1 by the previous plan, to download its state from B; B died before D got it."""
    checkpoints = {A: [(24, (0, 2))], E: [(24, (2, 4))]}
    alive = peers(A, C, D, E, checkpoints=checkpoints)
    origin = decide(alive, kept={A, B, C})
    assert origin.step == 24 and origin.handoff.resumed_from_checkpoint and "layers 2-3" in origin.note
    origin = decide(alive, kept={A, B, C}, progress={D: started(D)})
    assert origin.step == 30 and origin.handoff.sources == [A, C, D] and not origin.handoff.resumed_from_checkpoint
    assert decide(alive).handoff.sources == [A, C, D]  # a previous run's plan: every member counts


def test_the_members_that_keep_their_state_from_the_start_of_a_plan():
    previous = PREVIOUS
    moved = assignment_for([[A, E], [C, D]], IDS[9])  # E takes B's place, from the state of D
    handoff = moved.copy(update={"handoff": Handoff(sources=[A, C, D])})
    assert kept_state(handoff, previous) == {A, C, D}
    swapped = assignment_for([[B, A], [C, D]], IDS[9]).copy(update={"handoff": Handoff(sources=[A, B, C, D])})
    assert kept_state(swapped, previous) == {C, D}  # A and B changed stages: both download
    resumed = moved.copy(update={"handoff": Handoff(sources=[A, D], resumed_from_checkpoint=True)})
    assert kept_state(resumed, previous) == set()
    assert kept_state(moved, previous) == {A, C, D, E}  # no hand-off: all from the seed
    seeded = moved.copy(update={"handoff": Handoff(sources=[A, C], seeded_layers=[[2, 4]])})
    assert kept_state(seeded, previous) == {A, C, D, E}  # stage 1 starts again from the seed: nothing to download


def test_a_checkpoint_range_beyond_the_model_is_refused_or_counts_for_nothing():
    """A record naming layers [0, 10⁹) once made every reader expand a billion-element set."""
    for layers in ([0, 10**9], [3, 3], [4, 2]):
        with pytest.raises(ValidationError):
            CheckpointInfo(step=5, layers=layers)
    with pytest.raises(ValidationError):
        Handoff(sources=[A], seeded_layers=[[0, MAX_LAYERS + 1]])
    checkpoints = {A: [(24, (0, 2))], E: [(28, (0, MAX_LAYERS))]}  # E's covers the model, and far beyond it
    origin = decide(peers(A, C, E, checkpoints=checkpoints), previous=None, live_step=0)
    assert origin.step == 0 and origin.handoff is None  # no complete checkpoint of this model: from the seed
