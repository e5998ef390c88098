"""Clients train their stage when given an assignment, publish progress, and keep their weights across versions.

Four `hetswarm join --coordinator ID` processes (2 stages × 2 replicas of the tiny model) on 127.0.0.1, and two
(a single stage × 2 replicas: each computes the next step while the plan votes, client/training/stage_worker.py);
this test is their pinned coordinator: its own DHT node signs and publishes hand-made Assignments with the key the
clients pinned, and reads the Progress records they publish. Version 2 arrives mid-training with the same roles: the
clients switch, carry their weights and optimizer state over, and go on from the step it names.
"""
from __future__ import annotations

import asyncio
import re
import time

import pytest
from hivemind.utils import get_dht_time

from hetswarm.client.local.swarm import LocalSwarm
from hetswarm.client.peer.hivemind_compat import load_identity
from hetswarm.protocol.identity import peer_id_of
from hetswarm.protocol.keys import PROGRESS_FIELD
from hetswarm.protocol.model_config import get_model_config
from hetswarm.protocol.record_store import SwarmRecords
from hetswarm.protocol.records import Assignment, Handoff, PeerRole, Progress
from tests.helpers.dht_nodes import start_node

SWARM = "trainertest"
TINY = get_model_config("tiny")
SHAPES = {"2x2": (2, 2), "1x2": (1, 2)}
"""Stages × replicas of the runs."""
MAX_STEPS = 40
"""Room for the switch: on a fast machine a plan trains many steps while the test reads the records once."""
SWITCH_AFTER_STEP = 3
pytestmark = [pytest.mark.swarm, pytest.mark.timeout(240)]


def make_assignment(pipelines: list[list[str]], coordinator_id: str, *, version: int, step: int) -> Assignment:
    """Version 1 starts from the seed; later ones from the state the peers hold at `step` (as a coordinator's)."""
    everyone = sorted(peer for chain in pipelines for peer in chain)
    d_pp = len(pipelines[0])
    return Assignment(
        coordinator_id=coordinator_id, version=version, model=TINY.to_dict(), d_pp=d_pp, d_dp=len(pipelines),
        stage_layers=[list(bounds) for bounds in TINY.stage_layers(d_pp)],
        roles={peer: PeerRole(stage=s, replica=r) for r, chain in enumerate(pipelines) for s, peer in enumerate(chain)},
        pipelines=pipelines, predicted_step_s=0.0, breakdown={}, micro_batches=TINY.micro_batches, step=step,
        reason="test", issued_at=get_dht_time(), handoff=Handoff(sources=everyone) if step > 0 else None,
    )


def collect(dht, seen: dict[tuple[str, int, int], Progress], until, timeout_s: float) -> None:
    """Reads Progress records into `seen` ((peer, version, step) → record) until `until(seen)` holds."""
    deadline = time.monotonic() + timeout_s
    while not until(seen):
        assert time.monotonic() < deadline, f"timed out; progress seen: {sorted(seen)}"
        for peer, record in asyncio.run(SwarmRecords(dht, SWARM).read(PROGRESS_FIELD)).items():
            seen.setdefault((peer, record.assignment_version, record.step), record)
        time.sleep(0.2)


def reached(version: int, step: int, peers: list[str]):
    return lambda seen: all(any(k[0] == p and k[1] == version and k[2] >= step for k in seen) for p in peers)


@pytest.fixture(scope="module", params=list(SHAPES))
def run(tmp_path_factory, request) -> dict:
    d_pp, d_dp = SHAPES[request.param]
    tmp = tmp_path_factory.mktemp("trainer")
    with LocalSwarm(SWARM, workdir=tmp, preimported=True) as swarm:
        swarm.start_bootstrap()
        coordinator, key = start_node(SWARM, tmp / "coordinator.key", [swarm.initial_peers])
        try:
            coordinator_id = peer_id_of(key.get_public_key())
            names = [f"peer{i}" for i in range(d_pp * d_dp)]
            ids = [peer_id_of(load_identity(tmp / f"{name}.key").get_public_key()) for name in names]
            for name in names:
                swarm.start_client(name, "--coordinator", coordinator_id, "--max-steps", str(MAX_STEPS), "--seed", "3",
                                   "--torch-threads", "1", "--ttl", "20")
            pipelines = [ids[r * d_pp:(r + 1) * d_pp] for r in range(d_dp)]

            def announce(version: int, step: int) -> None:
                assignment = make_assignment(pipelines, coordinator_id, version=version, step=step)
                assert asyncio.run(SwarmRecords(coordinator, SWARM, private_key=key).publish(assignment, ttl_s=120))

            seen: dict[tuple[str, int, int], Progress] = {}
            announce(1, 0)
            collect(coordinator, seen, reached(1, SWITCH_AFTER_STEP, ids), timeout_s=150)
            switch_step = max(k[2] for k in seen) + 1
            announce(2, switch_step)
            collect(coordinator, seen, reached(2, MAX_STEPS - 1, ids), timeout_s=120)
            return {"seen": seen, "ids": ids, "last_stage": {chain[-1] for chain in pipelines},
                    "first_stage": {chain[0] for chain in pipelines},
                    "switch_step": switch_step, "logs": {name: swarm.peers[i + 1].output() for i, name in enumerate(names)}}
        finally:
            coordinator.shutdown()


def test_every_peer_publishes_progress_with_increasing_steps(run):
    for peer, log in zip(run["ids"], run["logs"].values()):
        entries = sorted((version, step) for p, version, step in run["seen"] if p == peer)
        assert entries[-1] == (2, MAX_STEPS - 1), entries
        v1_steps = [step for version, step in entries if version == 1]
        v2_steps = [step for version, step in entries if version == 2]
        assert v1_steps, entries
        # v1 from step 0: the peer's own log says so, since a reader polling the records may see its first record
        # only a few steps in (a single stage computes ahead: CI saw the first record seen at step 2)
        assert re.search(r"Assignment 1: stage \d+ of pipeline \d+, from step 0\b", log), log[-2000:]
        assert re.search(r"\bstep 0: loss|\bstep 0: \d+ tokens/s", log), log[-2000:]
        assert v2_steps[0] >= run["switch_step"], entries  # v2 goes on from the step it names, never back


def test_only_the_last_stage_reports_a_loss_and_every_step_record_has_timings(run):
    trained = [(peer, record) for (peer, _, _), record in run["seen"].items() if record.health == "training"]
    assert len(trained) >= len(run["ids"]) * 2
    for peer, record in trained:  # (a peer still on v1 while its group switched reports `retrying`, with no timings)
        assert (record.loss is not None) == (peer in run["last_stage"]), record
        assert record.tokens_per_s > 0 and record.compute_s > 0 and record.wait_s >= 0, record
        # what its neighbours' claims are checked by (coordinator/claims.py): none where it has no such neighbour
        assert (record.window_s is None) == (peer in run["first_stage"]), record
        assert (record.round_trip_s is None) == (peer in run["last_stage"]), record
        assert all(timing is None or timing > 0 for timing in (record.window_s, record.round_trip_s)), record


def test_a_new_version_keeps_the_weights(run):
    """Training goes on where it was: the loss after the switch is below the first steps' (a fresh model ~5.5), and
    every peer says it kept its state."""
    losses = {(version, step): record.loss for (_, version, step), record in run["seen"].items()
              if record.loss is not None}
    v2 = [record for (_, version, _), record in run["seen"].items() if version == 2 and record.health == "training"]
    assert v2 and all(record.state_origin in ("kept", "handed off") for record in v2), v2
    first = min(step for version, step in losses if version == 1)
    after_switch = min(step for version, step in losses if version == 2)
    assert losses[(2, after_switch)] < losses[(1, first)] - 0.3, losses


def test_clients_log_their_steps_and_stop_at_max_steps(run):
    for name, log in run["logs"].items():
        assert "Assignment 2:" in log and f"Reached step {MAX_STEPS}" in log, log[-2000:]
