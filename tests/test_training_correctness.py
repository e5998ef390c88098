"""A distributed step equals the single-process reference, and the swarm learns.

Four training processes (2 stages × 2 replicas of the tiny model, fp32 on CPU) on 127.0.0.1, each with its own
DHT node and p2p daemon, bootstrapped from a DHT node in this process. They follow a hand-made Assignment and
train 30 steps; the first step's loss and every parameter's gradient after the group all-reduce must equal
``reference_step`` on the same batch within 1e-5 (design.md, training correctness). So must the first step of three
processes that run 1F1B over an uneven cut with recomputation.
"""
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from hetswarm.client.training.data import TokenSource
from hetswarm.client.training.model import build_full_model
from hetswarm.client.training.reference import reference_step, step_batches
from hetswarm.client.training.stage_worker import StageConfig
from hetswarm.protocol.identity import load_identity, peer_id_of
from hetswarm.protocol.model_config import ModelConfig, get_model_config
from hetswarm.protocol.records import Assignment, PeerRole
from hetswarm.protocol.wire_format import WireFormat
from tests.conftest import reap_children
from tests.helpers.dht_nodes import start_node
from tests.helpers.training_process import TrainJob, run_training_processes

SWARM = "correctness"
TINY = get_model_config("tiny")
FP32 = WireFormat.uniform("fp32")
"""Exact arithmetic on the wire, so that the distributed step can equal the single-process one."""
SEED = 7
STEPS = 30
D_PP, D_DP = 2, 2
CONFIG = StageConfig(lr=3e-3, frame_timeout_s=60, sender_timeout_s=30, reducer_timeout_s=60, start_timeout_s=60)


def _assignment(pipelines: list[list[str]], coordinator_id: str, wire: WireFormat = FP32,
                model: ModelConfig = TINY, **runs) -> Assignment:
    """A plan over `pipelines`, cut evenly unless `runs` (stage_layers, recompute, schedule) says otherwise."""
    d_pp = len(pipelines[0])
    runs = {"stage_layers": [list(bounds) for bounds in model.stage_layers(d_pp)]} | runs
    return Assignment(
        coordinator_id=coordinator_id, version=1,
        model={k: v for k, v in model.to_dict().items() if v is not None},  # records carry no nulls
        d_pp=d_pp, d_dp=len(pipelines),
        roles={peer: PeerRole(stage=s, replica=r) for r, chain in enumerate(pipelines) for s, peer in enumerate(chain)},
        pipelines=pipelines, predicted_step_s=0.0, breakdown={}, micro_batches=model.micro_batches, step=0,
        reason="test", issued_at=0.0, wire=wire, **runs,
    )


def _run_swarm(tmp: Path, *, d_pp: int, d_dp: int, steps: int, model: ModelConfig = TINY, **runs) -> list[dict]:
    """Runs a d_dp × d_pp swarm of separate processes for `steps` steps; returns each one's results, in pipeline
    order."""
    identities = [tmp / f"peer{i}.key" for i in range(d_pp * d_dp)]
    peer_ids = [peer_id_of(load_identity(path).get_public_key()) for path in identities]
    pipelines = [peer_ids[r * d_pp:(r + 1) * d_pp] for r in range(d_dp)]
    bootstrap, key = start_node(SWARM, tmp / "bootstrap.key")
    try:
        assignment = _assignment(pipelines, peer_id_of(key.get_public_key()), model=model, **runs)
        initial_peers = [str(maddr) for maddr in bootstrap.get_visible_maddrs()]
        jobs = [TrainJob(swarm=SWARM, identity_path=path, initial_peers=initial_peers, assignment=assignment,
                         steps=steps, seed=SEED, output_path=tmp / f"peer{i}.pt", save_first_grads=True,
                         config=CONFIG, torch_threads=1)
                for i, path in enumerate(identities)]
        return run_training_processes(jobs, timeout_s=150)
    finally:
        bootstrap.shutdown()
        reap_children()


@pytest.fixture(scope="module")
def swarm_results(tmp_path_factory) -> list[dict]:
    """Runs the 4-process swarm once; returns each process's results, in pipeline order."""
    return _run_swarm(tmp_path_factory.mktemp("swarm"), d_pp=D_PP, d_dp=D_DP, steps=STEPS)


@pytest.mark.timeout(200)
def test_first_distributed_step_equals_the_single_process_reference(swarm_results):
    _assert_first_step_is_the_reference(swarm_results, TINY, d_pp=D_PP, d_dp=D_DP)


@pytest.mark.timeout(200)
def test_1f1b_with_an_uneven_cut_and_recomputation_equals_the_reference(tmp_path):
    """Three stages hold 2/1/1 layers and run 4 micro-batches in 1F1B order (warm-ups of 2, 1 and 0 forwards),
    rebuilding their activations in the backward pass: the step is still the single-process one."""
    model = replace(TINY, micro_batches=4)
    results = _run_swarm(tmp_path, d_pp=3, d_dp=1, steps=1, model=model, stage_layers=[[0, 2], [2, 3], [3, 4]],
                         recompute=True, schedule="1f1b")
    _assert_first_step_is_the_reference(results, model, d_pp=3, d_dp=1)


def _assert_first_step_is_the_reference(results: list[dict], model: ModelConfig, *, d_pp: int, d_dp: int) -> None:
    batches = step_batches(TokenSource.from_path(None), model, step=0, n_pipelines=d_dp)
    reference = reference_step(build_full_model(model, seed=SEED), batches)

    last_stage = [r for r in results if r["stage"] == d_pp - 1]
    distributed_loss = sum(r["reports"][0]["loss"] for r in last_stage) / d_dp  # mean over the pipelines
    assert distributed_loss == pytest.approx(reference.loss, abs=1e-5)
    assert all(r["reports"][0]["loss"] is None for r in results if r["stage"] != d_pp - 1)

    checked = set()
    for result in results:  # every replica of every stage holds the averaged gradient
        for name, grad in result["first_grads"].items():
            torch.testing.assert_close(grad, reference.grads[name], rtol=1e-5, atol=1e-5, msg=name)
            checked.add(name)
    assert checked == set(reference.grads)


def _swarm_losses(swarm_results: list[dict]) -> list[float]:
    last_stage = [r for r in swarm_results if r["stage"] == D_PP - 1]
    return [sum(r["reports"][step]["loss"] for r in last_stage) / D_DP for step in range(STEPS)]


@pytest.mark.timeout(200)
def test_loss_falls_over_thirty_steps(swarm_results):
    losses = _swarm_losses(swarm_results)
    assert sum(losses[-5:]) / 5 < losses[0] - 1.0, losses


@pytest.mark.timeout(200)
def test_thirty_steps_track_single_process_training(swarm_results):
    """Lock-step, the optimizer and the all-reduce keep the swarm on the single-process trajectory."""
    model, source = build_full_model(TINY, seed=SEED), TokenSource.from_path(None)
    optimizer = CONFIG.build_optimizer(model.parameters())
    expected = []
    for step in range(STEPS):
        expected.append(reference_step(model, step_batches(source, TINY, step=step, n_pipelines=D_DP)).loss)
        optimizer.step()
    assert _swarm_losses(swarm_results) == pytest.approx(expected, abs=1e-3)
