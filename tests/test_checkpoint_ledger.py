"""The coordinator records the roots its plans' named savers publish, and a resume or rollback counts only those
checkpoints (coordinator/checkpoint_ledger.py, coordinator/state_plan.py); a checkpoint's root is its units' digests
(client/training/checkpoints.py)."""
from __future__ import annotations

import json

import pytest

from hetswarm.client.training.checkpoints import CheckpointDir
from hetswarm.coordinator.checkpoint_ledger import MAX_RECORDED_STEPS, CheckpointLedger
from hetswarm.coordinator.run_state import CoordinatorState
from hetswarm.coordinator.state_plan import plan_state, rollback_state
from hetswarm.protocol.records import CheckpointInfo, CheckpointPlan, CheckpointRoot, PeerRecord
from tests.helpers.swarm_records import IDS, record
from tests.helpers.tiny_training import TINY, assignment_for, checkpoint_root, second_stage_state

A, B, C, D, FORGER = IDS[:5]
PLAN = assignment_for([[A, B], [C, D]], IDS[9]).copy(update={
    "version": 3, "checkpoints": CheckpointPlan(savers=[A, B], every=4)})  # A saves layers 0-1, B layers 2-3


def root(n: int) -> str:
    return f"{n:064x}"


def peers(holdings: dict[str, list[tuple[int, tuple[int, int], str | None]]], version: int = 3
          ) -> dict[str, PeerRecord]:
    return {peer: record(peer).copy(update={"checkpointing": True, "checkpoints": [
        CheckpointInfo(step=step, layers=list(layers), plan_version=version, root=digest)
        for step, layers, digest in held]}) for peer, held in holdings.items()}


def ledger_of(holdings: dict, version: int = 3) -> CheckpointLedger:
    ledger = CheckpointLedger()
    ledger.follow(PLAN)
    assert ledger.observe(peers(holdings, version))
    return ledger


def test_only_the_named_savers_roots_of_their_own_layers_are_recorded_and_the_first_one_stays():
    ledger = ledger_of({A: [(8, (0, 2), root(1))], B: [(8, (2, 4), root(2)), (8, (0, 2), root(3))],
                        C: [(8, (0, 2), root(4))], FORGER: [(8, (2, 4), root(5))], D: [(8, (2, 4), None)]})
    assert ledger.recorded == {8: {(0, 2): root(1), (2, 4): root(2)}}
    assert not ledger.observe(peers({A: [(8, (0, 2), root(6))]}))  # a saver cannot rewrite what it published
    assert not ledger.observe(peers({A: [(12, (0, 2), root(7))]}, version=4))  # no plan v4 named it
    assert ledger.roots(8) == [CheckpointRoot(layers=[0, 2], root=root(1)), CheckpointRoot(layers=[2, 4], root=root(2))]


def test_the_newest_steps_are_kept_and_the_record_survives_the_state_file():
    ledger = ledger_of({A: [(4 * step, (0, 2), root(step)) for step in range(1, MAX_RECORDED_STEPS + 3)]})
    assert sorted(ledger.recorded) == [4 * step for step in range(3, MAX_RECORDED_STEPS + 3)]
    state = CoordinatorState(coordinator_id=IDS[9], checkpoints=ledger.to_json())
    again = CoordinatorState.from_dict(json.loads(json.dumps(state.to_dict())))
    assert CheckpointLedger.from_json(again.checkpoints).recorded == ledger.recorded
    assert CoordinatorState.from_dict({"coordinator_id": IDS[9], "version": 1, "step": 0, "assignment": None}
                                      ).checkpoints == {}  # a state file written before checkpoints were recorded
    for bad in ({"8": {"0-2": "not hex"}}, {"8": {"2-0": root(1)}}, {"8": ["0-2"]}, ["8"]):
        with pytest.raises((ValueError, TypeError)):
            CheckpointLedger.from_json(bad)


def test_a_resume_counts_only_recorded_checkpoints_and_names_their_roots():
    ledger = ledger_of({A: [(8, (0, 2), root(1))], B: [(8, (2, 4), root(2))]})
    # a forger advertises a complete, newer checkpoint, and another copy of step 8's second stage
    alive = peers({A: [(8, (0, 2), root(1))], B: [(8, (2, 4), root(2))], FORGER: [(12, (0, 4), root(9)),
                                                                                   (8, (2, 4), root(9))]})
    origin = plan_state(previous=None, live_step=0, alive=set(alive), records=alive, progress={},
                        n_layers=TINY.n_layers, give_up=False, ledger=ledger)
    assert origin.step == 8 and origin.handoff.sources == sorted([A, B])
    assert origin.handoff.checkpoint_roots == ledger.roots(8)
    trusting = plan_state(previous=None, live_step=0, alive=set(alive), records=alive, progress={},
                          n_layers=TINY.n_layers, give_up=False, ledger=CheckpointLedger())
    assert trusting.step == 12 and trusting.handoff.checkpoint_roots == []  # the old rule, and it says so
    assert "no checkpoint roots recorded" in trusting.note
    rollback = rollback_state(alive, set(alive), TINY.n_layers, before=13, why="loss spike", ledger=ledger)
    assert rollback.step == 8 and rollback.handoff.checkpoint_roots == ledger.roots(8)


def test_a_saved_checkpoint_advertises_the_root_of_its_units_digests(tmp_path):
    checkpoints = CheckpointDir(tmp_path, "ledgertest")
    state = second_stage_state(12)
    checkpoints.save(state, layers=(2, 4), model=TINY, plan_version=3)
    (info,) = checkpoints.infos()
    assert info.root == checkpoint_root(state) and info.plan_version == 3
    assert checkpoints.list()[0].path.read_bytes() == state.encode()  # written from the units' encodings, joined
    meta_path = next(tmp_path.glob("ledgertest/*.json"))
    meta_path.write_text(json.dumps(json.loads(meta_path.read_text()) | {"root": "forged"}))
    assert checkpoints.infos() == []  # an unreadable checkpoint is skipped, not advertised


def test_checkpoints_the_ledger_shows_false_are_flagged_with_their_advertiser():
    ledger = ledger_of({A: [(8, (0, 2), root(1))], B: [(8, (2, 4), root(2))]})
    under_v3 = peers({
        A: [(8, (0, 2), root(1)), (12, (0, 2), root(3))],  # its own, recorded or not yet
        B: [(8, (2, 4), root(2))],
        C: [(8, (0, 4096), root(1))],  # layers the model does not have
        D: [(12, (2, 4), root(4))],  # plan v3 named B the saver of layers 2-4
    })
    under_v2 = peers({FORGER: [(8, (0, 2), root(5))],  # a plan no longer followed, and not the recorded root
                      IDS[5]: [(8, (2, 4), root(2))]}, version=2)  # the recorded root: nothing to hold against it
    flagged = ledger.contradicted(under_v3 | under_v2, TINY.n_layers)
    assert set(flagged) == {C, D, FORGER}, flagged
    assert "layers [0, 4096]; the model has 4" in flagged[C]
    assert "at step 12 written under plan v3, which named another saver of them" in flagged[D]
    assert f"with root {root(5)[:12]}…, not the {root(1)[:12]}… its saver wrote" in flagged[FORGER]
