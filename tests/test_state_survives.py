"""The model outlives any peer: one swarm on 127.0.0.1 goes through a kill, a join, the loss of a whole stage and a
stop of everything, and ends on exactly the parameters of a run that had none of it.

A coordinator (2 pipelines × 2 stages, checkpoints every 4 steps) and five clients (four placed, one standby), all
with checkpoint folders, train the tiny model with fp32 on the wire:
1. a placed client is SIGKILLed at a random step: the standby takes its place with the state handed off by the
   replica of its stage, and nobody else moves;
2. a client joins: it stays a standby and nobody moves;
3. both replicas of stage 1 are SIGKILLed; the stage-1 saver comes back (a new process, its old checkpoint
   folder): the swarm goes back to the newest step every stage has a checkpoint of, and says so;
4. every process is stopped with SIGINT and started again with the same folders: the coordinator resumes from
   the newest complete checkpoint C, and training goes on to step C + 8;
5. `hetswarm export` from the live swarm gives the folder it gives from the savers' checkpoints.
The parameters at C + 8 (the savers' checkpoints) equal, within 1e-5, those of a 2 × 2 run of as many steps on the
same data with no failure, and so does the loss of every step each client logged, re-runs after a resume included.
"""
from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from hetswarm.client.cli.app import app
from hetswarm.client.local.swarm import LocalSwarm, PeerProcess
from hetswarm.client.peer.hivemind_compat import load_identity
from hetswarm.client.training.checkpoints import CheckpointDir
from hetswarm.client.training.stage_state import units_of_layers
from hetswarm.coordinator.checkpoint_ledger import CheckpointLedger
from hetswarm.protocol.identity import peer_id_of
from hetswarm.protocol.keys import ASSIGNMENT_FIELD, PROGRESS_FIELD
from hetswarm.protocol.record_store import SwarmRecords
from hetswarm.protocol.records import Assignment
from tests.helpers.dht_nodes import start_node
from tests.helpers.golden_runs import CHECKPOINT_EVERY as EVERY
from tests.helpers.golden_runs import SWARM_RUN, final_state, golden_results_beside, losses
from tests.helpers.swarm_logs import JOINED, golden_plan_args, logged_losses, model_file
from tests.helpers.tiny_training import D_DP, SEED, TINY
from tests.helpers.waiting import wait_until

pytestmark = pytest.mark.swarm

SWARM = "statetest"
COORDINATOR_ARGS = (*golden_plan_args(EVERY), "--lost-state-wait", "600")


class Scenario:
    """The swarm, a DHT observer, and helpers that read what it publishes."""

    def __init__(self, swarm: LocalSwarm, tmp: Path) -> None:
        self.swarm, self.tmp = swarm, tmp
        self.observer = None
        self.clients: dict[str, PeerProcess] = {}
        self.folder_of: dict[str, Path] = {}  # peer id → checkpoint folder
        self.name_of: dict[str, str] = {}

    def start_clients(self, folders: dict[str, str], max_steps: int | None = None) -> list[str]:
        """Clients by name, each with its checkpoint folder (reused across restarts); returns their peer ids."""
        until = ("--max-steps", str(max_steps)) if max_steps else ()
        for name, folder in folders.items():
            self.clients[name] = self.swarm.start_client(
                name, "--coordinator", self.swarm.coordinator_id, "--ttl", "60", "--torch-threads", "1", "--seed",
                str(SEED), "--checkpoint-dir", str(self.tmp / folder), *until)
        peers = []
        for name, folder in folders.items():
            via = self.clients[name].wait_for(JOINED, timeout_s=120).group(1)
            if self.observer is None:
                self.observer, _ = start_node(SWARM, self.tmp / "observer.key", [via])
            peer = peer_id_of(load_identity(self.tmp / f"{name}.key").get_public_key())
            self.folder_of[peer], self.name_of[peer] = self.tmp / folder, name
            peers.append(peer)
        return peers

    def read(self, field: str) -> dict:
        return asyncio.run(SwarmRecords(self.observer, SWARM, timeout_s=10).read(field))

    def plan(self) -> Assignment | None:
        return self.read(ASSIGNMENT_FIELD).get(self.swarm.coordinator_id)

    def wait_for_plan(self, what: str, accept, timeout_s: float = 120) -> Assignment:
        return wait_until(what, lambda: (plan := self.plan()) is not None and accept(plan) and plan, timeout_s)

    def wait_for_step(self, step: int, timeout_s: float = 180) -> Assignment:
        """Until every member of the plan in force reports having applied `step` under it; returns that plan."""
        def reached() -> Assignment | None:
            plan, records = self.plan(), self.read(PROGRESS_FIELD)
            return plan if plan is not None and all(
                p in records and records[p].assignment_version == plan.version and records[p].health == "training"
                and records[p].step >= step for p in plan.roles) else None
        return wait_until(f"every member of the plan in force past step {step}", reached, timeout_s)

    def log_sizes(self) -> dict[Path, int]:
        return {log: log.stat().st_size for log in self.tmp.glob("*.log")}

    def losses(self, since: dict[Path, int] | None = None) -> dict[int, list[float]]:
        """Every loss the clients logged, by step (each last-stage client logs its pipeline's), after `since`."""
        return logged_losses(self.tmp.glob("*.log"), since=since)

    def checkpoint(self, peer: str, step: int, layers: tuple[int, int]) -> dict[str, torch.Tensor]:
        state = CheckpointDir(self.folder_of[peer], SWARM).find_part(step, units_of_layers(layers, TINY.n_layers))
        assert state is not None, f"no checkpoint of step {step} in {self.folder_of[peer]}"
        return {name: tensor for name, tensor in state.tensors.items() if ":" not in name}


@pytest.fixture(scope="module")
def story(tmp_path_factory, shared_tmp) -> dict:
    """The story, with the fault-free run it is compared with trained beside it: the story mostly waits for its
    swarm, and the golden run (tests/helpers/golden_runs.py) is not needed before the end."""
    tmp = tmp_path_factory.mktemp("state")
    found: dict = {}
    with golden_results_beside(SWARM_RUN, shared_tmp) as golden_swarm:
        with LocalSwarm(SWARM, workdir=tmp, preimported=True) as swarm:
            scenario = Scenario(swarm, tmp)
            try:
                _play(scenario, swarm, tmp, found)
            finally:
                if scenario.observer is not None:
                    scenario.observer.shutdown()
        golden = golden_swarm()
    found["baseline"] = {"final": final_state(golden, found["last_step"]), "losses": losses(golden, found["last_step"])}
    return found


def _play(scenario: Scenario, swarm: LocalSwarm, tmp: Path, found: dict) -> None:
    coordinator = swarm.start_coordinator("coordinator", "--model", str(model_file(tmp)), "--min-peers", "5",
                                          *COORDINATOR_ARGS)
    scenario.start_clients({f"peer{i}": f"ckpt{i}" for i in range(5)})
    first = scenario.wait_for_plan("the first plan", lambda plan: True)

    # 1. a placed client killed at a random step
    rng = random.Random(SEED)
    scenario.wait_for_step(rng.randrange(3, 8))
    victim = rng.choice(sorted(first.roles))
    scenario.clients[scenario.name_of[victim]].kill()
    found["killed"] = (first, victim)
    second = scenario.wait_for_plan("a plan without the killed peer", lambda plan: victim not in plan.roles)
    scenario.wait_for_step(second.step)
    found["after_kill"] = (second, scenario.read(PROGRESS_FIELD))

    # 2. a client joins
    [joiner] = scenario.start_clients({"joiner": "ckpt-joiner"})
    third = scenario.wait_for_plan("a plan that knows the joiner", lambda plan: plan.version > second.version,
                                   timeout_s=90)
    scenario.wait_for_step(third.step)
    found["after_join"] = (second, third, joiner, scenario.read(PROGRESS_FIELD))

    # 3. every replica of stage 1 killed; its saver comes back with its checkpoint folder
    in_force = scenario.wait_for_step(third.step + EVERY + 1)
    saver = in_force.checkpoints.savers[1]
    wait_until("a checkpoint of stage 1", lambda: newest_complete_checkpoint(tmp) is not None, 60)
    stage1 = [chain[1] for chain in in_force.pipelines]
    for peer in stage1:
        scenario.clients[scenario.name_of[peer]].kill()
    found["losses_at_kill"], sizes = scenario.losses(), scenario.log_sizes()
    scenario.start_clients({"saver-back": scenario.folder_of[saver].name})
    fourth = scenario.wait_for_plan("a plan that resumes from checkpoints",
                                    lambda plan: plan.version > in_force.version and plan.handoff is not None
                                    and plan.handoff.resumed_from_checkpoint)
    scenario.wait_for_step(fourth.step)
    found["resumed"] = (fourth, stage1, scenario.losses(since=sizes))

    # 4. everything stopped, and started again with the same folders, to train up to a step past the checkpoint
    placed = sorted(scenario.wait_for_step(fourth.step + 2 * EVERY).roles)
    for peer in placed:
        scenario.clients[scenario.name_of[peer]].stop()
    coordinator.stop()
    scenario.observer.shutdown()
    scenario.observer = None
    state_file = swarm.workdir / "coordinator.key.state.json"
    resume_at = newest_complete_checkpoint(tmp, recorded=recorded_checkpoints(state_file))
    assert resume_at is not None and resume_at > fourth.step, (resume_at, fourth.step)
    last = found["last_step"] = resume_at + 2 * EVERY
    assert last in SWARM_RUN.states_after, f"the golden run keeps no parameters after step {last}: lengthen it"
    sizes = scenario.log_sizes()
    swarm.start_coordinator("coordinator", "--model", str(model_file(tmp)), "--min-peers", "4", *COORDINATOR_ARGS,
                            "--export-every", str(last), "--export-dir", str(tmp / "exports"))  # due once: at `last`
    scenario.start_clients({f"again{i}": scenario.folder_of[peer].name for i, peer in enumerate(placed)},
                           max_steps=last)
    fifth = scenario.wait_for_plan("a plan after the restart", lambda plan: True)
    scenario.wait_for_step(last - 1, timeout_s=180)
    wait_until(f"the step-{last} checkpoints", lambda: all(
        list((scenario.folder_of[s] / SWARM).glob(f"*-step-{last}.json")) for s in fifth.checkpoints.savers), 60)
    found["restarted"] = (fifth, resume_at, scenario.losses(since=sizes))
    layers = [tuple(bounds) for bounds in fifth.stage_layers]
    found["final"] = {name: t for stage, s in enumerate(fifth.checkpoints.savers)
                      for name, t in scenario.checkpoint(s, last, layers[stage]).items()}
    found["losses"] = scenario.losses()

    # 5. the model leaves the swarm: `hetswarm export` from the live members, and from the savers' checkpoints;
    # and the coordinator's own export (--export-every)
    savers = [arg for saver in fifth.checkpoints.savers for arg in ("--checkpoint-dir", str(scenario.folder_of[saver]))]
    found["exports"] = {how: _export(tmp / f"export-{how}", args) for how, args in (
        ("live", ["--initial-peers", swarm.initial_peers, "--coordinator", swarm.coordinator_id]),
        ("checkpoints", savers))}
    periodic = tmp / "exports" / f"step-{last}"
    wait_until(f"the coordinator's export of step {last}", periodic.is_dir, 60)
    found["exports"]["coordinator"] = load_file(periodic / "model.safetensors")


def _export(out: Path, args: list[str]) -> dict[str, torch.Tensor]:
    result = CliRunner().invoke(app, ["export", "--out", str(out), "--swarm", SWARM, *args])
    assert result.exit_code == 0, (result.output, result.exception)
    return load_file(out / "model.safetensors")


def newest_complete_checkpoint(tmp: Path, recorded: dict[int, set[int]] | None = None) -> int | None:
    """The newest step whose checkpoints, in all the clients' folders together, cover every layer; with `recorded`,
    among the steps the coordinator recorded for every layer too."""
    covered: dict[int, set[int]] = {}
    for folder in tmp.glob("ckpt*"):
        for meta in CheckpointDir(folder, SWARM).list():
            covered.setdefault(meta.step, set()).update(range(*meta.layers))
    every_layer = set(range(TINY.n_layers))
    complete = [step for step, layers in covered.items()
                if layers == every_layer and (recorded is None or recorded.get(step) == every_layer)]
    return max(complete, default=None)


def recorded_checkpoints(state_file: Path) -> dict[int, set[int]]:
    """Step → the layers whose checkpoint root the coordinator recorded, from its state file: a resume counts only
    those (coordinator/checkpoint_ledger.py), and a stop can come between a saver's checkpoint and the coordinator's
    next read of its record."""
    ledger = CheckpointLedger.from_json(json.loads(state_file.read_text())["checkpoints"])
    return {step: {layer for bounds in roots for layer in range(*bounds)} for step, roots in ledger.recorded.items()}


@pytest.mark.timeout(900)
def test_a_killed_client_is_replaced_by_the_standby_with_the_state_handed_off(story):
    first, victim = story["killed"]
    second, progress = story["after_kill"]
    standby = next(peer for peer in second.roles if peer not in first.roles)
    assert second.roles[standby].stage == first.roles[victim].stage  # the standby took the dead peer's stage
    assert all(second.roles[p].stage == role.stage for p, role in first.roles.items() if p != victim), second.reason
    assert f"moved 1: …{standby[-6:]}→stage {first.roles[victim].stage}" in second.reason  # nobody else changed stage
    assert second.handoff is not None and not second.handoff.resumed_from_checkpoint
    assert progress[standby].state_origin == "handed off" and progress[standby].handoff_bytes > 0
    assert all(progress[p].state_origin == "kept" for p in second.roles if p != standby)
    assert second.step > first.step  # from the last committed step, not from the seed


@pytest.mark.timeout(900)
def test_a_joiner_stays_a_standby_and_nobody_moves(story):
    second, third, joiner, progress = story["after_join"]
    assert joiner not in third.roles
    assert all(third.roles[p].stage == role.stage for p, role in second.roles.items()), third.reason
    assert third.reason.endswith("nobody moves") or "nobody changes stage" in third.reason, third.reason
    assert all(progress[p].state_origin == "kept" for p in third.roles)


@pytest.mark.timeout(900)
def test_losing_every_replica_of_a_stage_resumes_from_the_newest_checkpoint(story):
    fourth, stage1, after = story["resumed"]
    before = story["losses_at_kill"]
    assert not set(stage1) & set(fourth.roles)
    assert fourth.step % EVERY == 0 and fourth.step <= max(before) + 1, (fourth.step, max(before))
    assert f"resumed from the checkpoints of step {fourth.step}" in fourth.reason
    assert fourth.handoff.checkpoint_roots and "no checkpoint roots recorded" not in fourth.reason  # the savers' own
    # The killed replicas are the last stages, which log the losses: a kill can land after one of them logged the
    # checkpoint's step and before the other did (or before either did). Every loss logged before the kill must come
    # again from the resumed plan, which logs one per pipeline.
    resumed = after[fourth.step]
    assert len(resumed) == D_DP, resumed
    for loss in before.get(fourth.step, []):
        assert min(abs(loss - again) for again in resumed) <= 1e-4, (before[fourth.step], resumed)


@pytest.mark.timeout(900)
def test_a_stopped_swarm_started_again_continues_from_its_checkpoints(story):
    fifth, resume_at, after = story["restarted"]
    assert fifth.step == resume_at and fifth.handoff.resumed_from_checkpoint, fifth.reason
    assert min(after) == resume_at and max(after) == story["last_step"] - 1


@pytest.mark.timeout(900)
def test_the_model_exported_from_the_live_swarm_is_the_export_of_its_checkpoints(story):
    """By `hetswarm export` from the live members, and by the coordinator's --export-every."""
    saved = story["exports"]["checkpoints"]
    for live in (story["exports"]["live"], story["exports"]["coordinator"]):
        assert sorted(live) == sorted(saved) and len(live) == len(story["final"])
        for name, tensor in live.items():
            assert torch.equal(tensor, saved[name]), name


@pytest.mark.timeout(900)
def test_the_model_after_all_of_it_equals_a_run_without_failures(story):
    baseline = story["baseline"]
    assert set(story["final"]) == set(baseline["final"])
    for name, value in story["final"].items():
        torch.testing.assert_close(value, baseline["final"][name], rtol=0, atol=1e-5,
                                   msg=lambda message, name=name: f"{name}: {message}")
    logged = story["losses"]
    assert set(logged) == set(range(story["last_step"]))
    for step, losses in logged.items():  # every run of every step, re-runs after a resume included
        for loss in losses:
            assert min(abs(loss - expected) for expected in baseline["losses"][step]) <= 1e-5, (step, loss)
