"""The live cost model: what one training step of a deployed plan takes on the measured swarm.

The paper's model prices communication only, because its GPUs are identical (docs/dtfm.md, Cost model). A swarm of
volunteers is not, so the live model adds what the paper leaves out:

    step_s = DataP + 2·PipeP                      communication: 2·PipeP is the paper's, on the measured matrices
           + max_s t_s                            compute of the slowest stage over the whole batch
           + (Σ_s t_s − max_s t_s) / M            GPipe's fill and drain bubble
           + max_{i,j} α_ij / 1000                the commit vote: the last peer's vote crossing the plan
    t_s    = F_s · B / D_DP / min_{r} TFLOPS[s, r]
    DataP  = max_s (A_s − Σ_{j<s} b_j · t_j / M)  the all-reduces, less what the pipeline's drain hides
    A_s    = max_{i,j ∈ C_s} 2·(α_ij/1000 + 8·c_s / (D_DP·β_ij))

F_s is stage s's forward+backward FLOPs per token (ModelConfig.stage_flops_per_token, PaLM Appendix B), B the batch
tokens of one step over all pipelines, M the micro-batches per pipeline, and the slowest replica of a stage sets
its time because every replica waits for the stage group's all-reduce. With M micro-batches of time t_s / M each,
GPipe's makespan is Σ_s t_s/M + (M − 1)·max_s t_s/M (Huang et al. 2019, GPipe, Sect. 2.2), which is the compute and
bubble lines; for equal stages the bubble is the familiar (D_PP − 1)/M of the compute. Every peer then pushes its
vote on the step to every other and applies the step once it has all votes (client/training/step_commit.py), so a
step ends one latency of the plan's farthest pair after the last peer finished.

The all-reduce is priced as the runtime runs it, not as the paper prices it. hivemind's AllReduceRunner sends every
shard at once, each pair over its own path, so stage group C_s takes its slowest pair's two sends of its share of
c_s, the payload of the stage's own layers (the paper sums a member's sends, as if one followed another). And a stage
starts its all-reduce as soon as its own backward pass ends (client/training/stage_worker.py), while the last
micro-batch's gradients still cross the stages before it, each spending its backward share b_j of t_j / M (2/3;
3/4 recomputing): only what outlasts that is on the step's critical path (`exposed_allreduce_s`). Activations and
gradients between stages are still added to the compute, as the paper adds them, though they overlap in part, so
the figure errs high. benchmarks/mixed_swarm.py checks it against measured steps (benchmarks/RESULTS.md).

Memory: a peer must hold its stage's parameters, gradients and AdamW states (16 bytes per parameter: fp32 weights,
gradients, two moments) plus the activations GPipe keeps for all M micro-batches until the backward pass,
34·h + 5·a·s bytes per token per layer for 16-bit activations (Korthikanti et al. 2022, "Reducing Activation
Recomputation in Large Transformer Models", Sect. 4.1). A plan putting a stage on a peer that cannot hold it is
refused (`NoFeasiblePlan`).

How a plan runs (`Execution`, carried by the Assignment) changes both: its cut of the layers (a stage of slow
devices may hold fewer), its micro-batch count M, and recomputation, where each layer keeps only its input (h
values per token) and rebuilds the rest in the backward pass, one layer of one micro-batch at a time (Chen et al.
2016, "Training Deep Nets with Sublinear Memory Cost"), for a third more compute (the forward runs twice).
`StageCosts` tabulates every stage position and layer count, so that the search (coordinator/live_objective.py)
prices cuts by indexing.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hetswarm.coordinator.plan import Plan
from hetswarm.protocol.errors import HetswarmError
from hetswarm.protocol.model_config import ModelConfig
from hetswarm.protocol.units import BYTES_PER_GIB

__all__ = ["Execution", "LiveBreakdown", "NoFeasiblePlan", "StageCosts", "exposed_allreduce_s", "predict_step_s",
           "stage_compute_s", "stage_memory_bytes"]

OPTIMIZER_BYTES_PER_PARAM = 16
"""fp32 weights (4) + gradients (4) + AdamW first and second moments (4 + 4)."""
_ACTIVATION_BYTES_PER_TOKEN_PER_D = 34
"""Korthikanti et al. 2022, Sect. 4.1: 34·s·b·h + 5·a·s²·b bytes per layer with 16-bit activations."""
_RECOMPUTE_FLOPS = 4 / 3
"""Forward (2 of the 6 FLOPs per parameter and token) done twice."""
_BACKWARD_SHARE = {False: 2 / 3, True: 3 / 4}
"""The backward pass's share of a stage's compute: 4 of 6 FLOPs per parameter and token, 6 of 8 recomputing."""


class NoFeasiblePlan(HetswarmError):
    """No plan fits the swarm: too few peers for the degrees asked for, or a stage does not fit a peer's memory."""


@dataclass(frozen=True, kw_only=True, slots=True)
class LiveBreakdown:
    """Seconds of one training step, by cause."""

    data_parallel_s: float
    """The stage groups' all-reduces, as far as they outlast the pipeline (`exposed_allreduce_s`)."""
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


@dataclass(frozen=True, kw_only=True, slots=True)
class Execution:
    """How a plan runs its stages (the Assignment carries it): the layers of each, the micro-batches each pipeline
    splits a step into, and whether the stages recompute their activations in the backward pass instead of keeping
    them (Chen et al. 2016, "Training Deep Nets with Sublinear Memory Cost": each layer keeps only its input)."""

    layer_counts: tuple[int, ...]
    """Layers of each stage, in stage order."""
    micro_batches: int
    recompute: bool = False

    @classmethod
    def even(cls, model: ModelConfig, d_pp: int, *, micro_batches: int | None = None,
             recompute: bool = False) -> Execution:
        """The model's own cut (ModelConfig.stage_layers) and micro-batch count."""
        return cls(layer_counts=tuple(b - a for a, b in model.stage_layers(d_pp)),
                   micro_batches=micro_batches or model.micro_batches, recompute=recompute)

    @classmethod
    def of_layers(cls, stage_layers: list[list[int]], *, micro_batches: int, recompute: bool) -> Execution:
        """From a plan's layer ranges (an Assignment's `stage_layers`)."""
        return cls(layer_counts=tuple(b - a for a, b in stage_layers), micro_batches=micro_batches,
                   recompute=recompute)

    @property
    def stage_layers(self) -> list[tuple[int, int]]:
        """Layer range [a, b) of each stage."""
        ends = np.cumsum(self.layer_counts).tolist()
        return [(end - count, end) for end, count in zip(ends, self.layer_counts)]

    def describe(self) -> str:
        return (f"layers {'/'.join(map(str, self.layer_counts))}, {self.micro_batches} micro-batches"
                f"{', recomputing activations' if self.recompute else ''}")


class StageCosts:
    """What a stage of l layers at stage position s needs, for every l in 0..n_layers: tables of shape
    (d_pp, n_layers + 1), so that any cut of the model is priced by indexing (the search tries many)."""

    def __init__(self, model: ModelConfig, *, d_pp: int, d_dp: int, micro_batches: int, recompute: bool,
                 dp_bytes_per_value: float | None = None) -> None:
        layers = np.arange(model.n_layers + 1)
        tokens = model.batch_tokens / d_dp  # one pipeline's share of the step

        def table(quantity) -> np.ndarray:
            return np.array([[quantity(int(count), first=s == 0, last=s == d_pp - 1) for count in layers]
                             for s in range(d_pp)], dtype=float)

        params = table(model.params_of)
        full = _ACTIVATION_BYTES_PER_TOKEN_PER_D * model.d_model + 5 * model.n_heads * model.seq_len  # per layer
        if recompute:  # every micro-batch's layer inputs, and one layer of one micro-batch rebuilt at a time
            kept = tokens * layers * model.d_model * model.activation_bytes_per_value
            activations = kept + np.where(layers > 0, tokens / micro_batches * full, 0.0)
        else:  # GPipe keeps every activation of every micro-batch until the backward pass
            activations = tokens * layers * full
        self.memory_bytes = params * OPTIMIZER_BYTES_PER_PARAM + activations[None, :]
        """Parameters with optimizer state, plus stored activations (Korthikanti et al. 2022, Sect. 4.1)."""
        self.flops = table(model.flops_per_token_of) * tokens * (_RECOMPUTE_FLOPS if recompute else 1.0)
        """Per step and pipeline; recomputation runs the forward pass twice."""
        self.dp_bytes = table(lambda count, **where: model.dp_payload_bytes_of(
            count, bytes_per_value=dp_bytes_per_value, **where))
        self.micro_batches = micro_batches

    @classmethod
    def of(cls, model: ModelConfig, execution: Execution, *, d_dp: int,
           dp_bytes_per_value: float | None = None) -> StageCosts:
        return cls(model, d_pp=len(execution.layer_counts), d_dp=d_dp, micro_batches=execution.micro_batches,
                   recompute=execution.recompute, dp_bytes_per_value=dp_bytes_per_value)

    def at(self, table: np.ndarray, layer_counts: tuple[int, ...]) -> np.ndarray:
        """(d_pp,) the entries of `table` for a cut."""
        return table[np.arange(len(layer_counts)), list(layer_counts)]


def stage_memory_bytes(model: ModelConfig, *, d_pp: int, d_dp: int, execution: Execution | None = None
                       ) -> list[float]:
    """Bytes a peer needs to train each stage: parameters with optimizer state, plus stored activations."""
    execution = execution or Execution.even(model, d_pp)
    costs = StageCosts.of(model, execution, d_dp=d_dp)
    return costs.at(costs.memory_bytes, execution.layer_counts).tolist()


def stage_compute_s(model: ModelConfig, grid: np.ndarray, tflops: np.ndarray, execution: Execution | None = None
                    ) -> np.ndarray:
    """(d_pp,) seconds each stage computes per step, set by its slowest replica.

    Args:
        grid: (d_pp, d_dp) device ids, grid[s, r] runs stage s of pipeline r.
        tflops: (N,) measured TFLOPS of every device.
    """
    d_pp, d_dp = grid.shape
    execution = execution or Execution.even(model, d_pp)
    costs = StageCosts.of(model, execution, d_dp=d_dp)
    slowest = tflops[grid].min(axis=1)  # (d_pp,)
    if (slowest <= 0).any():
        raise NoFeasiblePlan(f"stage {int(np.argmin(slowest))} has a device with no measured TFLOPS")
    return costs.at(costs.flops, execution.layer_counts) / (slowest * 1e12)


def exposed_allreduce_s(allreduce_s: np.ndarray, stage_s: np.ndarray, *, micro_batches: int, recompute: bool
                        ) -> np.ndarray:
    """(...,) DataP as the runtime runs it: the part of the stage groups' all-reduces that outlasts the pipeline.

    A stage starts its all-reduce when its own backward pass ends (client/training/stage_worker.py), and the last
    micro-batch's gradients still have stage s − 1 down to 0 to cross: stage s's all-reduce has at least their
    backward of one micro-batch, Σ_{j<s} b_j / M, to run hidden. Stage 0 has none, so DataP ≥ its all-reduce.

    Args:
        allreduce_s, stage_s: (..., d_pp) each stage's all-reduce and compute per step, in stage order.
    """
    backward = stage_s * _BACKWARD_SHARE[recompute] / micro_batches
    lead = np.cumsum(backward, axis=-1) - backward  # Σ_{j<s}
    return (allreduce_s - lead).max(axis=-1)


def predict_step_s(plan: Plan, model: ModelConfig, *, tflops: np.ndarray, memory_gib: np.ndarray,
                   latency_ms: np.ndarray | None = None, execution: Execution | None = None) -> LiveBreakdown:
    """The live model's step time of a deployed plan (module docstring); `plan.breakdown` is its paper cost (for
    an uneven cut, priced with each stage's own payload: `cost_plan`'s `stage_dp_bytes`).

    Args:
        tflops, memory_gib: (N,) per device, indexed like the plan's grid.
        latency_ms: (N, N) measured latencies, for the commit vote; None leaves it out (a plan priced for the
            paper's comparisons).
        execution: the plan's cut, micro-batches and recomputation; None: the model's even cut and micro-batches.

    Raises:
        NoFeasiblePlan: a stage is placed on a device whose memory cannot hold it.
    """
    grid = plan.grid
    d_pp, d_dp = grid.shape
    execution = execution or Execution.even(model, d_pp)
    need_gib = np.asarray(stage_memory_bytes(model, d_pp=d_pp, d_dp=d_dp, execution=execution)) / BYTES_PER_GIB
    short = np.asarray(memory_gib)[grid] < need_gib[:, None]  # (d_pp, d_dp)
    if short.any():
        stage, replica = np.argwhere(short)[0]
        raise NoFeasiblePlan(f"stage {stage} needs {need_gib[stage]:.2f} GiB but device {grid[stage, replica]} has "
                             f"{memory_gib[grid[stage, replica]]:.2f} GiB")
    compute = stage_compute_s(model, grid, np.asarray(tflops, dtype=float), execution)
    return LiveBreakdown(
        data_parallel_s=float(exposed_allreduce_s(plan.stage_allreduce_s, compute,
                                                  micro_batches=execution.micro_batches,
                                                  recompute=execution.recompute)),
        pipeline_parallel_s=plan.breakdown.pipeline_parallel_s,
        compute_s=float(compute.max()),
        bubble_s=float((compute.sum() - compute.max()) / execution.micro_batches),
        commit_s=0.0 if latency_ms is None else float(np.asarray(latency_ms)[np.ix_(grid.ravel(), grid.ravel())].max())
        / 1000,
    )
