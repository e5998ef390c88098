"""One hostile member each: its own signed votes, or its partners', plan it out.

A member that votes failure on every attempt, and says what it likes besides, is planned out, and the model ends as
if it had never been there.

A coordinator (2 pipelines × 2 stages, checkpoints every 4 steps) and five clients (four placed, one standby) train
the tiny model with fp32 on the wire. At a random step one placed member turns hostile (a test-only switch,
tests/helpers/process_faults.py): from then on it votes failure on every attempt, naming another member as the cause,
a different one each time, so that no step commits; and its records lie besides: a loss spike at every step it
reports, every other member reported unreachable, and plan version 10⁹ claimed as the one it follows. No rollback
follows (one pipeline's spike), nobody it reports is left out (the coordinator's ping answers for them, and the report
leaves out its reporter), and versions go on from the plan's. The honest members show the coordinator the signed failure
votes of the aborted attempts; the coordinator leaves the attacker out, says why in its refusals, and the standby
takes its place with the state handed off by its stage's replica. Nobody honest is left out, and the parameters
after the last step equal, within 1e-5, those of a plain 2 × 2 run of as many steps on the same data, as does every
step's loss.

A reducer that answers its partners' shares with NaN or skewed averages (a stage group of training processes,
tests/helpers/training_process.py) gets no replica to apply a step; the failure votes its partners would show the
coordinator name it, and implicate it alone when two partners corroborate each other (with one partner, both).
"""
from __future__ import annotations

import asyncio
import random

import pytest
import torch
from hivemind.utils import get_dht_time

from hetswarm.client.local.swarm import LocalSwarm
from hetswarm.client.peer.hivemind_compat import load_identity
from hetswarm.client.training.checkpoints import CheckpointDir
from hetswarm.client.training.stage_state import units_of_layers
from hetswarm.coordinator.failure_votes import judge_aborts
from hetswarm.protocol.identity import peer_id_of
from hetswarm.protocol.keys import PROGRESS_FIELD
from hetswarm.protocol.record_store import SwarmRecords
from hetswarm.protocol.records import Assignment, Progress
from hetswarm.protocol.votes import AbortedAttempt
from tests.helpers.dht_nodes import start_node
from tests.helpers.golden_runs import CHECKPOINT_EVERY, final_state, losses
from tests.helpers.process_faults import hostile_votes_env
from tests.helpers.swarm_logs import JOINED, golden_plan_args, logged_losses, model_file
from tests.helpers.tiny_training import SEED, TINY, assignment_for, train_swarm
from tests.helpers.training_process import Fault
from tests.helpers.waiting import wait_until

pytestmark = pytest.mark.swarm

SWARM = "freeze"
STEPS = 48
NAMES = [f"peer{i}" for i in range(5)]


@pytest.fixture(scope="module")
def frozen(tmp_path_factory, golden_swarm) -> dict:
    tmp = tmp_path_factory.mktemp("freeze")
    found: dict = {}
    ids = {peer_id_of(load_identity(tmp / f"{name}.key").get_public_key()): name for name in NAMES}
    with LocalSwarm(SWARM, workdir=tmp, preimported=True) as swarm:
        swarm.start_coordinator("coordinator", "--model", str(model_file(tmp)), "--min-peers", "5",
                                *golden_plan_args(CHECKPOINT_EVERY))
        clients = [swarm.start_client(
            name, "--coordinator", swarm.coordinator_id, "--ttl", "60", "--torch-threads", "1", "--seed", str(SEED),
            "--max-steps", str(STEPS), "--checkpoint-dir", str(tmp / f"ckpt-{name}"),
            env=hostile_votes_env(tmp / f"hostile-{name}")) for name in NAMES]
        via = clients[0].wait_for(JOINED, 120).group(1)
        observer, _ = start_node(SWARM, tmp / "observer.key", [via])
        try:
            records = SwarmRecords(observer, SWARM, timeout_s=10)
            plan = lambda: asyncio.run(records.assignments()).get(swarm.coordinator_id)  # noqa: E731
            first: Assignment = wait_until("the first plan", plan, 180)
            rng = random.Random(SEED)
            attacker = rng.choice(sorted(first.roles))
            wait_until("the first steps", lambda: any(
                r.step >= 1 for r in asyncio.run(records.read(PROGRESS_FIELD)).values()), 120)
            (tmp / f"hostile-{ids[attacker]}").touch()
            second = wait_until("a plan without the attacker", lambda: (p := plan()) is not None
                                and attacker not in p.roles and p, 120)
            found["refusals"] = swarm.poll(lambda s: any(r["peer_id"] == attacker for r in s["refused"]),
                                           timeout_s=30)["refused"]
            wait_until(f"every member past step {STEPS - 1}", lambda: _done(records, plan()), 240)
            wait_until(f"the step-{STEPS} checkpoints", lambda: all(
                list((tmp / f"ckpt-{ids[saver]}" / SWARM).glob(f"*-step-{STEPS}.json"))
                for saver in second.checkpoints.savers), 60)
            found["final"] = {name: tensor for stage, saver in enumerate(second.checkpoints.savers)
                              for name, tensor in _checkpoint(tmp / f"ckpt-{ids[saver]}", STEPS,
                                                              tuple(second.stage_layers[stage])).items()}
            found["plans"], found["attacker"] = (first, second, plan()), attacker
            found["losses"] = logged_losses(tmp.glob("*.log"))
            found["coordinator_log"] = (tmp / "coordinator.log").read_text(errors="replace")
        finally:
            observer.shutdown()
    found["baseline"] = {"final": final_state(golden_swarm, STEPS), "losses": losses(golden_swarm, STEPS)}
    return found


def _done(records: SwarmRecords, plan: Assignment | None) -> bool:
    progress = asyncio.run(records.read(PROGRESS_FIELD))
    return plan is not None and all(p in progress and progress[p].assignment_version == plan.version
                                    and progress[p].step >= STEPS - 1 for p in plan.roles)


def _checkpoint(folder, step: int, layers: tuple[int, int]) -> dict[str, torch.Tensor]:
    state = CheckpointDir(folder, SWARM).find_part(step, units_of_layers(layers, TINY.n_layers))
    assert state is not None, f"no checkpoint of step {step} in {folder}"
    return {name: tensor for name, tensor in state.tensors.items() if ":" not in name}


@pytest.mark.timeout(900)
def test_the_attacker_alone_is_planned_out_and_named_with_its_votes(frozen):
    (first, second, last), attacker = frozen["plans"], frozen["attacker"]
    refused = {r["peer_id"]: r["reason"] for r in frozen["refusals"]}
    named_for = ("its failure votes aborted", "unreachable, but it answers the coordinator's ping")
    assert any(why in refused[attacker] for why in named_for), refused
    assert set(refused) == {attacker}, refused  # none of the members it named or reported
    assert any(why in second.reason for why in named_for), second.reason
    [standby] = set(second.roles) - set(first.roles)
    assert second.roles[standby].stage == first.roles[attacker].stage  # it took the attacker's place
    assert all(second.roles[p].stage == role.stage for p, role in first.roles.items() if p != attacker)
    assert last.version == second.version  # and the swarm trained on under that plan to the end
    assert second.version <= first.version + 3  # the claim of version 10⁹ moved nothing
    assert "rolling back" not in frozen["coordinator_log"]
    assert "unreachable, which answers our ping: leaving the reporter out instead" in frozen["coordinator_log"]
    assert not (second.handoff and second.handoff.resumed_from_checkpoint)


@pytest.mark.timeout(900)
def test_the_model_equals_the_run_without_the_attacker(frozen):
    baseline = frozen["baseline"]
    assert frozen["final"].keys() == baseline["final"].keys()
    for name, tensor in frozen["final"].items():
        torch.testing.assert_close(tensor, baseline["final"][name], rtol=1e-5, atol=1e-5, msg=name)
    assert set(range(STEPS)) <= set(frozen["losses"]), sorted(frozen["losses"])
    for step in range(STEPS):
        assert sorted(set(frozen["losses"][step])) == pytest.approx(sorted(baseline["losses"][step]), rel=1e-4), step


@pytest.mark.timeout(300)
@pytest.mark.parametrize("fault, d_dp", [(Fault.NAN_AVERAGES, 3), (Fault.NAN_AVERAGES, 2), (Fault.SKEWED_AVERAGES, 3)],
                         ids=["nan-3", "nan-2", "skewed-3"])
def test_a_reducer_that_answers_wrong_averages_is_named_by_its_partners_and_their_votes_plan_it_out(
        tmp_path, fault, d_dp):
    """A stage group of training processes in which the last member answers the others' shares with NaN, or with
    1.5 times the average (inside every bound: its partners' audits re-reduce it; a 10⁷-times-scaled average is
    refused by the norm bound, tests/test_group_allreduce.py): no replica applies a step,
    every honest partner votes failure naming it, and the votes they would show the coordinator implicate it alone
    when two partners name it; with one partner, the two go together (no vote can say which of two lies)."""
    swarm = f"hostilereducer{d_dp}"
    results = train_swarm(tmp_path, swarm=swarm, steps=3, d_pp=1, d_dp=d_dp, faulty=d_dp - 1, fault=fault,
                          stop_on_abort=True, seed=SEED)
    liar, *_ = [result["peer_id"] for result in results if result["faulty"]]
    assert not any(result["reports"] for result in results)  # nothing applied, anywhere
    plan = assignment_for([[result["peer_id"]] for result in results], coordinator_id=liar)
    shown = {result["peer_id"]: Progress(
        peer_id=result["peer_id"], assignment_version=plan.version, step=0, loss=None, tokens_per_s=0.0,
        compute_s=0.0, wait_s=0.0, health="retrying", aborted=[AbortedAttempt.parse_obj(a) for a in result["aborted"]],
        updated_at=get_dht_time()) for result in results if not result["faulty"]}
    honest = set(shown)
    honest_votes = [vote for record in shown.values() for a in record.aborted for vote in a.failures
                    if vote.peer in honest]  # the liar's own votes are its to make up: the judge weighs them
    assert honest_votes and all(vote.cause == liar for vote in honest_votes), honest_votes
    found = judge_aborts(plan, swarm, shown)
    assert set(found) == ({liar} if d_dp > 2 else {liar, *honest}), found
    assert found[liar].startswith("named by"), found
