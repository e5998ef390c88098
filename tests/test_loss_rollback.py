"""A loss spike sends the swarm back to a checkpoint taken before it, and the run ends as if nothing had happened.

A coordinator (2 pipelines × 2 stages, checkpoints every 4 steps) and four clients train the tiny model with fp32
on the wire; every client scrambles its weights right after committing step CORRUPT (a test-only fault,
tests/helpers/process_faults.py), the same way on both replicas of a stage, as a poisoned update that slipped
past every check would: the replicas still agree, their gradients pass the all-reduce's checks, but the loss jumps.
(A single corrupted replica is caught earlier, by its partner's all-reduce.) The coordinator publishes the same roles from the newest complete checkpoint of a step whose loss was normal, and says
why. Every step's last logged loss, and so the model they trained, equals (1e-4) that of a plain 2 × 2 run.

One member also forges checkpoints (tests/helpers/process_faults.py): its record advertises a complete checkpoint of
step CORRUPT - 1, newer than the clean one, and one of layers [0, MAX_LAYERS); a coordinator that took holders at
their word would roll back to it. The swarm goes back to its savers' checkpoint all the same, and the coordinator
flags the forger with the reason.
"""
from __future__ import annotations

import asyncio

import pytest

from hetswarm.client.local.swarm import LocalSwarm
from hetswarm.client.peer.hivemind_compat import load_identity
from hetswarm.protocol.identity import peer_id_of
from hetswarm.protocol.keys import PROGRESS_FIELD
from hetswarm.protocol.record_store import SwarmRecords
from tests.helpers.dht_nodes import start_node
from tests.helpers.golden_runs import losses
from tests.helpers.process_faults import corrupt_after_step_env, forged_checkpoints_env
from tests.helpers.swarm_logs import JOINED, golden_plan_args, logged_losses, model_file
from tests.helpers.tiny_training import SEED, TINY
from tests.helpers.waiting import wait_until

pytestmark = pytest.mark.swarm

SWARM = "rollback"
STEPS, CORRUPT, EVERY = 40, 18, 8
"""The clients train on for a few steps before the rollback plan reaches them, so the checkpoint it names (16)
must outlive the next one (24), not two more: each saver keeps its last two."""
FORGER = 2
"""The client that also advertises checkpoints it never wrote."""
SITES = ("Oregon", "Oregon", "Tokyo", "Tokyo")
"""Emulated world-wide links make a step take about a second, as on a real swarm: loopback steps (0.1 s) outrun
the coordinator's once-a-second look, and the clean checkpoints would be rotated out before it acts."""


@pytest.fixture(scope="module")
def rolled_back(tmp_path_factory, golden_swarm) -> dict:
    tmp = tmp_path_factory.mktemp("rollback")
    found: dict = {}
    with LocalSwarm(SWARM, workdir=tmp, preimported=True) as swarm:
        swarm.start_coordinator("coordinator", "--model", str(model_file(tmp)), "--min-peers", "4",
                                *golden_plan_args(EVERY))
        clients = [swarm.start_client(
            f"peer{i}", "--coordinator", swarm.coordinator_id, "--ttl", "60", "--torch-threads", "1", "--seed",
            str(SEED), "--max-steps", str(STEPS), "--checkpoint-dir", str(tmp / f"ckpt{i}"), "--emulate", "worldwide",
            "--site", SITES[i],
            env=corrupt_after_step_env(CORRUPT) | (forged_checkpoints_env(CORRUPT - 1, TINY.n_layers)
                                                   if i == FORGER else {})) for i in range(4)]
        via = clients[0].wait_for(JOINED, 120).group(1)
        observer, _ = start_node(SWARM, tmp / "observer.key", [via])
        try:
            records = SwarmRecords(observer, SWARM)
            plan = lambda: asyncio.run(records.assignments()).get(swarm.coordinator_id)  # noqa: E731
            rollback = wait_until("a plan that rolls back", lambda: (p := plan()) is not None and p.handoff is not None
                                  and p.handoff.resumed_from_checkpoint and p, 240)

            def done() -> bool:
                progress = asyncio.run(records.read(PROGRESS_FIELD))
                return all(p in progress and progress[p].assignment_version == rollback.version
                           and progress[p].step >= STEPS - 1 for p in rollback.roles)

            wait_until(f"every member past step {STEPS - 1} after the rollback", done, 240)
            found["rollback"], found["final"] = rollback, plan()
            found["flagged"] = asyncio.run(records.refusals(swarm.coordinator_id))[swarm.coordinator_id].flagged
        finally:
            observer.shutdown()
        found["losses"] = logged_losses(tmp.glob("peer*.log"), last_only=True)
        found["coordinator_log"] = (tmp / "coordinator.log").read_text(errors="replace")
    found["baseline"] = losses(golden_swarm, STEPS)
    found["forger"] = peer_id_of(load_identity(tmp / f"peer{FORGER}.key").get_public_key())
    return found


@pytest.mark.timeout(900)
def test_the_spike_is_named_and_the_swarm_goes_back_to_a_checkpoint_before_the_fault(rolled_back):
    rollback = rolled_back["rollback"]
    assert rollback.step <= CORRUPT and rollback.step % EVERY == 0  # trained only on steps before the fault
    assert "loss spike at step" in rollback.reason and f"rolled back to the checkpoints of step {rollback.step}" \
        in rollback.reason
    recorded = {tuple(checkpoint.layers) for checkpoint in rollback.handoff.checkpoint_roots}
    assert recorded == {tuple(layers) for layers in rollback.stage_layers}  # each stage's saver's root
    assert "rolling back" in rolled_back["coordinator_log"]
    assert rolled_back["final"].version == rollback.version  # once: the run went on from there


@pytest.mark.timeout(900)
def test_a_member_that_advertises_checkpoints_it_never_wrote_is_flagged_and_not_loaded(rolled_back):
    rollback, forger = rolled_back["rollback"], rolled_back["forger"]
    assert rollback.step < CORRUPT - 1  # not the forged, newer checkpoint
    assert "advertises a checkpoint of layers" in rolled_back["flagged"].get(forger, ""), rolled_back["flagged"]
    assert f"Peer {forger}: advertises a checkpoint" in rolled_back["coordinator_log"]


@pytest.mark.timeout(900)
def test_every_loss_after_the_rollback_equals_a_run_without_the_fault(rolled_back):
    losses, baseline = rolled_back["losses"], rolled_back["baseline"]
    assert set(range(STEPS)) <= set(losses), sorted(losses)
    for step in range(STEPS):
        assert sorted(losses[step]) == pytest.approx(sorted(baseline[step]), rel=1e-4), step
