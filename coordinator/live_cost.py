"""The live cost model: what one training step of a deployed plan takes on the measured swarm.

The paper's model prices communication only, because its GPUs are identical (docs/dtfm.md, Cost model). A swarm of
volunteers is not, so the live model adds what the paper leaves out:

    step_s = DataP + 2·PipeP                      communication, the paper's model on the measured matrices
           + max_s t_s                            compute of the slowest stage over the whole batch
           + (Σ_s t_s − max_s t_s) / M            GPipe's fill and drain bubble
           + max_{i,j} α_ij / 1000                the commit vote: the last peer's vote crossing the plan
    t_s    = F_s · B / D_DP / min_{r} TFLOPS[s, r]

F_s is stage s's forward+backward FLOPs per token (ModelConfig.stage_flops_per_token, PaLM Appendix B), B the batch
tokens of one step over all pipelines, M the micro-batches per pipeline, and the slowest replica of a stage sets
its time because every replica waits for the stage group's all-reduce. With M micro-batches of time t_s / M each,
GPipe's makespan is Σ_s t_s/M + (M − 1)·max_s t_s/M (Huang et al. 2019, GPipe, Sect. 2.2), which is the last two
lines; for equal stages the bubble is the familiar (D_PP − 1)/M of the compute. Every peer then pushes its vote on
the step to every other and applies the step once it has all votes (client/training/step_commit.py), so a step
ends one latency of the plan's farthest pair after the last peer finished. The terms are added, as the paper adds
DataP and PipeP: no overlap of communication with compute is assumed, so the figure errs high.

Memory: a peer must hold its stage's parameters, gradients and AdamW states (16 bytes per parameter: fp32 weights,
gradients, two moments) plus the activations GPipe keeps for all M micro-batches until the backward pass,
34·h + 5·a·s bytes per token per layer for 16-bit activations (Korthikanti et al. 2022, "Reducing Activation
Recomputation in Large Transformer Models", Sect. 4.1). A plan putting a stage on a peer that cannot hold it is
refused (`NoFeasiblePlan`).

The search optimises the paper's communication cost (coordinator.scheduler.find_plan) and the live model prices
its result and the candidates of the shape choice; it does not steer the search itself.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hetswarm.coordinator.plan import Plan
from hetswarm.protocol.errors import HetswarmError
from hetswarm.protocol.model_config import ModelConfig
from hetswarm.protocol.units import BYTES_PER_GIB

__all__ = ["LiveBreakdown", "NoFeasiblePlan", "predict_step_s", "stage_compute_s", "stage_memory_bytes"]

OPTIMIZER_BYTES_PER_PARAM = 16
"""fp32 weights (4) + gradients (4) + AdamW first and second moments (4 + 4)."""
_ACTIVATION_BYTES_PER_TOKEN_PER_D = 34
"""Korthikanti et al. 2022, Sect. 4.1: 34·s·b·h + 5·a·s²·b bytes per layer with 16-bit activations."""


class NoFeasiblePlan(HetswarmError):
    """No plan fits the swarm: too few peers for the degrees asked for, or a stage does not fit a peer's memory."""


@dataclass(frozen=True, kw_only=True, slots=True)
class LiveBreakdown:
    """Seconds of one training step, by cause."""

    data_parallel_s: float
    """DataP of the paper's model: the slowest stage group's sharded all-reduce."""
    pipeline_parallel_s: float
    """2·PipeP of the paper's model, as deployed: activations forward and their gradients backward."""
    compute_s: float
    """The slowest stage's forward and backward over its pipeline's share of the batch."""
    bubble_s: float
    """GPipe's fill and drain: the other stages' time of one micro-batch each."""
    commit_s: float = 0.0
    """The commit vote: the largest one-way latency between two peers of the plan."""

    @property
    def total_s(self) -> float:
        return self.data_parallel_s + self.pipeline_parallel_s + self.compute_s + self.bubble_s + self.commit_s

    def to_dict(self) -> dict[str, float]:
        """Plain floats (the Assignment schema is strict), with the total as `step_s`."""
        return {"data_parallel_s": float(self.data_parallel_s), "pipeline_parallel_s": float(self.pipeline_parallel_s),
                "compute_s": float(self.compute_s), "bubble_s": float(self.bubble_s),
                "commit_s": float(self.commit_s), "step_s": float(self.total_s)}


def stage_memory_bytes(model: ModelConfig, *, d_pp: int, d_dp: int) -> list[float]:
    """Bytes a peer needs to train each stage: parameters with optimizer state, plus GPipe's stored activations."""
    tokens = model.batch_tokens / d_dp  # one pipeline's share of the step, all micro-batches kept
    per_layer = tokens * (_ACTIVATION_BYTES_PER_TOKEN_PER_D * model.d_model + 5 * model.n_heads * model.seq_len)
    return [params * OPTIMIZER_BYTES_PER_PARAM + (b - a) * per_layer
            for params, (a, b) in zip(model.stage_params(d_pp), model.stage_layers(d_pp))]


def stage_compute_s(model: ModelConfig, grid: np.ndarray, tflops: np.ndarray) -> np.ndarray:
    """(d_pp,) seconds each stage computes per step, set by its slowest replica.

    Args:
        grid: (d_pp, d_dp) device ids, grid[s, r] runs stage s of pipeline r.
        tflops: (N,) measured TFLOPS of every device.
    """
    d_pp, d_dp = grid.shape
    flops = np.asarray(model.stage_flops_per_token(d_pp)) * model.batch_tokens / d_dp  # (d_pp,) per pipeline
    slowest = tflops[grid].min(axis=1)  # (d_pp,)
    if (slowest <= 0).any():
        raise NoFeasiblePlan(f"stage {int(np.argmin(slowest))} has a device with no measured TFLOPS")
    return flops / (slowest * 1e12)


def predict_step_s(plan: Plan, model: ModelConfig, *, tflops: np.ndarray, memory_gib: np.ndarray,
                   latency_ms: np.ndarray | None = None) -> LiveBreakdown:
    """The live model's step time of a deployed plan (module docstring); `plan.breakdown` is its paper cost.

    Args:
        tflops, memory_gib: (N,) per device, indexed like the plan's grid.
        latency_ms: (N, N) measured latencies, for the commit vote; None leaves it out (a plan priced for the
            paper's comparisons).

    Raises:
        NoFeasiblePlan: a stage is placed on a device whose memory cannot hold it.
    """
    grid = plan.grid
    d_pp, d_dp = grid.shape
    need_gib = np.asarray(stage_memory_bytes(model, d_pp=d_pp, d_dp=d_dp)) / BYTES_PER_GIB  # (d_pp,)
    short = np.asarray(memory_gib)[grid] < need_gib[:, None]  # (d_pp, d_dp)
    if short.any():
        stage, replica = np.argwhere(short)[0]
        raise NoFeasiblePlan(f"stage {stage} needs {need_gib[stage]:.2f} GiB but device {grid[stage, replica]} has "
                             f"{memory_gib[grid[stage, replica]]:.2f} GiB")
    compute = stage_compute_s(model, grid, np.asarray(tflops, dtype=float))
    return LiveBreakdown(
        data_parallel_s=plan.breakdown.data_parallel_s,
        pipeline_parallel_s=plan.breakdown.pipeline_parallel_s,
        compute_s=float(compute.max()),
        bubble_s=float((compute.sum() - compute.max()) / model.micro_batches),
        commit_s=0.0 if latency_ms is None else float(np.asarray(latency_ms)[np.ix_(grid.ravel(), grid.ravel())].max())
        / 1000,
    )
