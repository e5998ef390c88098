"""A distributed step equals the single-process reference, and the swarm learns.

Four training processes (2 stages × 2 replicas of the tiny model, fp32 on CPU) on 127.0.0.1, each with its own
DHT node and p2p daemon, bootstrapped from a DHT node in this process. They follow a hand-made Assignment and
train 30 steps (the session's golden run, tests/helpers/golden_runs.py, which other tests compare with too); the first step's loss and every parameter's gradient after the group all-reduce must equal
``reference_step`` on the same batch within 1e-5 (design.md, training correctness). So must the first step of three
processes that run 1F1B over an uneven cut with recomputation.
"""
from dataclasses import replace

import pytest

from hetswarm.client.training.data import TokenSource
from hetswarm.client.training.model import build_full_model
from hetswarm.client.training.reference import reference_step, step_batches
from hetswarm.client.training.stage_worker import StageConfig
from tests.helpers.golden_runs import LR3_CONFIG, TINY_RUN, states
from tests.helpers.tiny_training import (
    D_DP,
    D_PP,
    SEED,
    TINY,
    assert_first_step_is_the_reference,
    assert_held_out_is_the_models,
    train_swarm,
)

pytestmark = pytest.mark.swarm

STEPS = TINY_RUN.steps
CONFIG = StageConfig(lr=LR3_CONFIG.lr, frame_timeout_s=60, sender_timeout_s=30, reducer_timeout_s=60,
                     start_timeout_s=60)


@pytest.mark.timeout(200)
def test_first_distributed_step_equals_the_single_process_reference(golden_tiny):
    assert_first_step_is_the_reference(golden_tiny, TINY, d_pp=D_PP, d_dp=D_DP)


@pytest.mark.timeout(200)
def test_1f1b_with_an_uneven_cut_and_recomputation_equals_the_reference(tmp_path):
    """Three stages hold 2/1/1 layers and run 4 micro-batches in 1F1B order (warm-ups of 2, 1 and 0 forwards),
    rebuilding their activations in the backward pass: the step is still the single-process one."""
    model = replace(TINY, micro_batches=4)
    results = train_swarm(tmp_path, swarm="correctness", d_pp=3, d_dp=1, steps=1, model=model, seed=SEED,
                          save_first_grads=True, save_final_state=True, config=CONFIG,
                          runs={"stage_layers": [[0, 2], [2, 3], [3, 4]], "recompute": True, "schedule": "1f1b",
                                "eval_every": 1})
    assert_first_step_is_the_reference(results, model, d_pp=3, d_dp=1)
    # the held-out pass goes through the middle stage too, forward only
    assert_held_out_is_the_models(results, model, [r["final_state"] for r in results], step=0, d_pp=3, d_dp=1)


def _swarm_losses(results: list[dict]) -> list[float]:
    last_stage = [r for r in results if r["stage"] == D_PP - 1]
    return [sum(r["reports"][step]["loss"] for r in last_stage) / D_DP for step in range(STEPS)]


@pytest.mark.timeout(200)
def test_the_held_out_loss_is_the_models_on_the_held_out_windows_and_falls(golden_tiny):
    """The plan evaluates every TINY_RUN.eval_every steps: after step 5 (the parameters after 6 steps are kept)
    each pipeline reports the loss of the model it holds, and training lowers it."""
    every = TINY_RUN.eval_every
    assert_held_out_is_the_models(golden_tiny, TINY, states(golden_tiny, every), step=every - 1, d_pp=D_PP, d_dp=D_DP)
    last_stage = golden_tiny[D_PP - 1]["reports"]
    evaluated = [step for step, report in enumerate(last_stage) if report["held_out_loss"] is not None]
    assert evaluated == list(range(every - 1, STEPS, every))
    assert last_stage[evaluated[-1]]["held_out_loss"] < last_stage[evaluated[0]]["held_out_loss"] - 0.5


@pytest.mark.timeout(200)
def test_loss_falls_over_thirty_steps(golden_tiny):
    losses = _swarm_losses(golden_tiny)
    assert sum(losses[-5:]) / 5 < losses[0] - 1.0, losses


@pytest.mark.timeout(200)
def test_thirty_steps_track_single_process_training(golden_tiny):
    """Lock-step, the optimizer and the all-reduce keep the swarm on the single-process trajectory."""
    model, source = build_full_model(TINY, seed=SEED), TokenSource.from_path(None)
    optimizer = LR3_CONFIG.build_optimizer(model.parameters())
    expected = []
    for step in range(STEPS):
        expected.append(reference_step(model, step_batches(source, TINY, step=step, n_pipelines=D_DP)).loss)
        LR3_CONFIG.set_step_lr(optimizer, TINY, step)
        optimizer.step()
    assert _swarm_losses(golden_tiny) == pytest.approx(expected, abs=1e-3)
