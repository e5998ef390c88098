"""The CUDA path of a stage: a 2 × 2 swarm of training processes shares one GPU, each stage computing in bf16
autocast over fp32 weights (client/training/stage_worker.py) and sending its frames over libp2p as on the CPU.

Skipped without a CUDA device: CI has none. benchmarks/RESULTS.md (sections gpu-stage-*) records where it ran.
"""
import math

import pytest
import torch

from hetswarm.client.training.data import TokenSource
from hetswarm.client.training.model import build_full_model
from hetswarm.client.training.reference import reference_step, step_batches
from tests.helpers.golden_runs import LR3_CONFIG
from tests.helpers.tiny_training import D_DP, D_PP, SEED, TINY, train_swarm

pytestmark = [pytest.mark.swarm, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

STEPS, EVAL_EVERY = 12, 6
BF16_TOLERANCE = 2e-2
"""Relative: bf16 keeps 8 bits of mantissa (about 0.4 %), and a step's sums over micro-batches and replicas add up."""


def _relative_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    return float((got - expected).norm() / expected.norm().clamp_min(1e-12))


@pytest.mark.timeout(300)
def test_a_swarm_on_a_gpu_tracks_fp32_single_process_training_within_bf16(tmp_path):
    results = train_swarm(tmp_path, swarm="cuda", steps=STEPS, seed=SEED, device="cuda", config=LR3_CONFIG,
                          save_first_grads=True, save_final_state=True, runs={"eval_every": EVAL_EVERY})

    for stage in range(D_PP):  # the all-reduce and the commit keep the replicas bit-identical on a GPU too
        first, second = (r["final_state"] for r in results if r["stage"] == stage)
        assert all(torch.equal(first[name], second[name]) for name in first), f"stage {stage}'s replicas differ"

    model, source = build_full_model(TINY, seed=SEED), TokenSource.from_path(None)
    optimizer = LR3_CONFIG.build_optimizer(model.parameters())
    expected = []
    for step in range(STEPS):
        reference = reference_step(model, step_batches(source, TINY, step=step, n_pipelines=D_DP))
        if step == 0:
            errors = {name: _relative_error(grad, reference.grads[name])
                      for r in results for name, grad in r["first_grads"].items()}
            assert set(errors) == set(reference.grads)
            assert max(errors.values()) < BF16_TOLERANCE, sorted(errors.items(), key=lambda item: -item[1])[:5]
        expected.append(reference.loss)
        LR3_CONFIG.set_step_lr(optimizer, TINY, step)
        optimizer.step()

    last_stage = [r for r in results if r["stage"] == D_PP - 1]
    losses = [sum(r["reports"][step]["loss"] for r in last_stage) / D_DP for step in range(STEPS)]
    assert losses == pytest.approx(expected, rel=BF16_TOLERANCE), (losses, expected)
    held_out = [r["reports"][EVAL_EVERY - 1]["held_out_loss"] for r in last_stage]
    assert len(set(held_out)) == 1 and math.isfinite(held_out[0]), held_out
