"""The live cost model: what one training step of a deployed plan takes on the measured swarm.

The paper's model prices communication only, because its GPUs are identical (docs/dtfm.md, Cost model). A swarm of
volunteers is not, so the live model adds what the paper leaves out:

    step_s  = max_s (max_r (T_r − Σ_{j<s} b_jr) + A_s) + V                       all-reduces, then the vote
    V       = max_{i,j} α_ij / 1000; max(0, V − max_r T_r) on a single stage    the farthest pair's latency
    T_r     = Φ_r(f) + Φ_r(b)                          pipeline r's forward and backward passes
    Φ_r(x)  = Σ_s x_sr + Σ_h p_hr + (M − 1)·max(max_s x_sr, max_h p_hr)
    f_sr, b_sr = (1 − w)·t_sr / M, w·t_sr / M          one micro-batch's forward and backward on stage s
    t_sr    = F_s · B / D_DP / TFLOPS[s, r]            stage s of pipeline r, over its share of the step
    p_hr    = α_hr/1000 + 8·c_PP / (M·β_hr)            one micro-batch's activations (or gradients), hop h of r
    A_s     = max_{i,j ∈ C_s} 2·(α_ij/1000 + 8·c_s / (D_DP·β_ij))

F_s is stage s's forward+backward FLOPs per token (ModelConfig.stage_flops_per_token, PaLM Appendix B), B the batch
tokens of one step over all pipelines, M the micro-batches per pipeline and w the backward's share of the compute
(2/3; 3/4 recomputing). TFLOPS is what the device's probe published, or, once it has trained under a plan and
computes more than 2× unlike that (relative to the swarm's typical efficiency), what its reported compute times show
(coordinator/claims.py). Pipelines run side by side, each at the pace of its own devices and hops, until their stage
groups' all-reduces (the search's objective charges every hop at its slowest pipeline's, a bound:
coordinator/scheduling/live_objective.py).
Φ is GPipe's makespan of one phase (Huang et al. 2019, GPipe, Sect. 2.2) over a chain whose stages are
the compute stages *and the hops between them*: a hop sends micro-batch m while the stage behind it computes m + 1
(client/training/stage_passes.py sends in the background), one message after another on each direction of a link
(client/peer/emulation.py emulates exactly that wire). When compute is the bottleneck, T_r = max_s t_sr +
(Σ_s t_sr − max_s t_sr)/M + 2·Σ_h p_hr: the compute, the bubble (for equal stages the familiar (D_PP − 1)/M of the
compute), and each hop's transfer of *one* micro-batch each way, where the paper charges 2·PipeP, the whole batch's
(docs/dtfm.md). The breakdown reports the slowest pipeline's compute, bubble and hops, and as DataP what the
all-reduces add to it (`step_terms`). Every peer then pushes its vote on the step to every other and applies the step
once it has all votes (client/training/step_commit.py), so a step ends one latency of the plan's farthest pair after
the last peer finished. A single stage needs no frames for its passes, so it applies the step on its own success and
computes the next step's passes while the vote is out (client/training/stage_worker.py): only what the vote
outlasts them by is on its critical path (`exposed_vote_s`).

The all-reduce is priced as the runtime runs it, not as the paper prices it. hivemind's AllReduceRunner sends every
shard at once, each pair over its own path, so stage group C_s takes its slowest pair's two sends of its share of
c_s, the payload of the stage's own layers (the paper sums a member's sends, as if one followed another). And a stage
starts its all-reduce as soon as its last replica's backward pass ends (client/training/stage_worker.py), while the
last micro-batch's gradients still cross the stages before it, each spending b_jr: only what outlasts that is on the
step's critical path (`step_terms`). benchmarks/mixed_swarm.py checks the model against measured steps
(benchmarks/RESULTS.md).

Memory: a peer must hold its stage's parameters, gradients and AdamW states (16 bytes per parameter: fp32 weights,
gradients, two moments) plus what each micro-batch in flight keeps for its backward pass: bytes per token per layer
as Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models", Sect. 4.1) count them,
recounted for these blocks on the CUDA path (fused attention keeps no scores;
ModelConfig.activation_bytes_per_token_of), and autocast's bf16 copies of the weights, one per forward pass
(ModelConfig.micro_batch_bytes_of); tests/test_model.py checks both against what autograd saves. GPipe keeps all M
micro-batches until the backward pass. 1F1B (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training
on GPU Clusters Using Megatron-LM", Sect. 2.2.1; PipeDream-Flush) starts micro-batch m's backward as soon as it can,
so stage s holds at most min(D_PP − s, M) of them. Its step is GPipe's for equal stages and no longer for unequal
ones, so the step time above holds for GPipe and bounds 1F1B (tests/test_pipeline_schedule.py plays both). A plan
putting a stage on a peer that cannot hold it is refused (`NoFeasiblePlan`).

How a plan runs (`Execution`, carried by the Assignment) changes both: its cut of the layers (a stage of slow
devices may hold fewer), its pipeline schedule, its micro-batch count M, and recomputation, where each layer keeps
only its fp32 input (4·h bytes per token) and rebuilds the rest in the backward pass, one layer of one micro-batch
at a time (Chen et al. 2016, "Training Deep Nets with Sublinear Memory Cost"), for a third more compute (the forward
runs twice).
`StageCosts` tabulates every stage position and layer count, so that the search (coordinator/scheduling/live_objective.py)
prices cuts by indexing.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from hetswarm.coordinator.scheduling.plan import Plan
from hetswarm.protocol.errors import HetswarmError
from hetswarm.protocol.model_config import ModelConfig, PipelineSchedule
from hetswarm.protocol.units import BYTES_PER_GIB

if TYPE_CHECKING:  # the scheduler runs without the record schemas' pydantic (tests/test_import_doors.py)
    from hetswarm.protocol.records import Assignment

__all__ = ["Execution", "ExecutionOption", "LiveBreakdown", "NoFeasiblePlan", "StageCosts", "exposed_vote_s",
           "in_flight", "pipeline_terms", "predict_step_s", "stage_compute_s", "stage_memory_bytes", "step_terms"]

OPTIMIZER_BYTES_PER_PARAM = 16
"""fp32 weights (4) + gradients (4) + AdamW first and second moments (4 + 4)."""
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
    """The stage groups' all-reduces, as far as they outlast the pipelines (`step_terms`)."""
    pipeline_parallel_s: float
    """Activations forward and their gradients backward, as far as they outlast the compute (`pipeline_terms`)."""
    compute_s: float
    """The slowest stage's forward and backward over its pipeline's share of the batch."""
    bubble_s: float
    """GPipe's fill and drain: the other stages' time of one micro-batch each."""
    commit_s: float = 0.0
    """The commit vote: the largest one-way latency between two peers of the plan, less the next step's compute
    on a single stage (`exposed_vote_s`)."""

    @property
    def total_s(self) -> float:
        return self.data_parallel_s + self.pipeline_parallel_s + self.compute_s + self.bubble_s + self.commit_s

    def to_dict(self) -> dict[str, float]:
        """Plain floats (the Assignment schema is strict), with the total as `step_s`."""
        return {"data_parallel_s": float(self.data_parallel_s), "pipeline_parallel_s": float(self.pipeline_parallel_s),
                "compute_s": float(self.compute_s), "bubble_s": float(self.bubble_s),
                "commit_s": float(self.commit_s), "step_s": float(self.total_s)}


class ExecutionOption(NamedTuple):
    """An `Execution` but for its cut: what the planner chooses to make stages fit (live_objective.execution_options)."""

    micro_batches: int
    recompute: bool = False
    schedule: PipelineSchedule = "gpipe"


@dataclass(frozen=True, kw_only=True, slots=True)
class Execution:
    """How a plan runs its stages (the Assignment carries it): the layers of each, the micro-batches each pipeline
    splits a step into, the pipeline schedule, and whether the stages recompute their activations in the backward
    pass instead of keeping them (Chen et al. 2016, "Training Deep Nets with Sublinear Memory Cost": each layer keeps
    only its input)."""

    layer_counts: tuple[int, ...]
    """Layers of each stage, in stage order."""
    micro_batches: int
    recompute: bool = False
    schedule: PipelineSchedule = "gpipe"

    @classmethod
    def even(cls, model: ModelConfig, d_pp: int, *, micro_batches: int | None = None, recompute: bool = False,
             schedule: PipelineSchedule = "gpipe") -> Execution:
        """The model's own cut (ModelConfig.stage_layers) and micro-batch count."""
        return cls(layer_counts=tuple(b - a for a, b in model.stage_layers(d_pp)),
                   micro_batches=micro_batches or model.micro_batches, recompute=recompute, schedule=schedule)

    @classmethod
    def of_assignment(cls, assignment: Assignment) -> Execution:
        """How an assignment's stages run."""
        return cls(layer_counts=tuple(b - a for a, b in assignment.stage_layers),
                   micro_batches=assignment.micro_batches, recompute=assignment.recompute,
                   schedule=assignment.schedule)

    @property
    def option(self) -> ExecutionOption:
        return ExecutionOption(self.micro_batches, self.recompute, self.schedule)

    @property
    def stage_layers(self) -> list[tuple[int, int]]:
        """Layer range [a, b) of each stage."""
        ends = np.cumsum(self.layer_counts).tolist()
        return [(end - count, end) for end, count in zip(ends, self.layer_counts)]

    def describe(self) -> str:
        return (f"layers {'/'.join(map(str, self.layer_counts))}, {self.micro_batches} micro-batches"
                f"{', 1F1B' if self.schedule == '1f1b' else ''}"
                f"{', recomputing activations' if self.recompute else ''}")


def in_flight(schedule: PipelineSchedule, *, d_pp: int, micro_batches: int) -> np.ndarray:
    """(d_pp,) micro-batches whose activations a stage holds at most at once (module docstring, Memory)."""
    if schedule == "gpipe":
        return np.full(d_pp, micro_batches)
    return np.minimum(d_pp - np.arange(d_pp), micro_batches)


class StageCosts:
    """What a stage of l layers at stage position s needs, for every l in 0..n_layers: tables of shape
    (d_pp, n_layers + 1), so that any cut of the model is priced by indexing (the search tries many)."""

    def __init__(self, model: ModelConfig, *, d_pp: int, d_dp: int, micro_batches: int, recompute: bool,
                 schedule: PipelineSchedule = "gpipe", dp_bytes_per_value: float | None = None) -> None:
        layers = np.arange(model.n_layers + 1)
        tokens = model.batch_tokens / d_dp  # one pipeline's share of the step

        def table(quantity) -> np.ndarray:
            return np.array([[quantity(int(count), first=s == 0, last=s == d_pp - 1) for count in layers]
                             for s in range(d_pp)], dtype=float)

        params = table(model.params_of)
        micro_batch_tokens = tokens / micro_batches
        held = in_flight(schedule, d_pp=d_pp, micro_batches=micro_batches)[:, None]  # micro-batches, (d_pp, 1)
        # a stage keeps its fp32 output for the backward call its gradient comes back to (the last, a loss)
        output = table(lambda count, *, first, last: 0.0 if last else 4.0 * model.d_model)
        if recompute:  # each micro-batch in flight keeps its layers' inputs, and one layer of one is rebuilt at a time
            def without_layers(quantity) -> np.ndarray:  # what the embedding and the head keep
                return table(lambda count, **where: quantity(0, **where))

            per_token = (layers * model.checkpoint_bytes_per_token_per_layer
                         + without_layers(model.activation_bytes_per_token_of) + output)
            kept = held * (micro_batch_tokens * per_token + without_layers(model.micro_batch_bytes_of))
            rebuilt = (micro_batch_tokens * model.activation_bytes_per_token_per_layer
                       + model.micro_batch_bytes_of(1, first=False, last=False))
            activations = kept + np.where(layers > 0, rebuilt, 0.0)
        else:  # everything the micro-batches in flight keep, until their backward pass
            activations = held * (micro_batch_tokens * (table(model.activation_bytes_per_token_of) + output)
                                  + table(model.micro_batch_bytes_of))
        self.memory_bytes = params * OPTIMIZER_BYTES_PER_PARAM + activations  # (d_pp, L + 1)
        """Parameters with optimizer state, plus stored activations (Korthikanti et al. 2022, Sect. 4.1)."""
        self.flops = table(model.flops_per_token_of) * tokens * (_RECOMPUTE_FLOPS if recompute else 1.0)
        """Per step and pipeline; recomputation runs the forward pass twice."""
        self.dp_bytes = table(lambda count, **where: model.dp_payload_bytes_of(
            count, bytes_per_value=dp_bytes_per_value, **where))
        self.micro_batches = micro_batches
        for kept in (self.memory_bytes, self.flops, self.dp_bytes):
            kept.flags.writeable = False  # shared by every caller of `of`

    @classmethod
    def of(cls, model: ModelConfig, execution: Execution, *, d_dp: int,
           dp_bytes_per_value: float | None = None) -> StageCosts:
        """The tables for a model run the way `execution` says, built once per such way: pricing a plan
        (`predict_step_s`) asks for them twice, and a brute-force check of the search prices thousands of plans."""
        return _stage_costs(model, len(execution.layer_counts), d_dp, execution.micro_batches, execution.recompute,
                            execution.schedule, dp_bytes_per_value)

    def at(self, table: np.ndarray, layer_counts: tuple[int, ...]) -> np.ndarray:
        """(d_pp,) the entries of `table` for a cut."""
        return table[np.arange(len(layer_counts)), list(layer_counts)]


@functools.lru_cache(maxsize=64)
def _stage_costs(model: ModelConfig, d_pp: int, d_dp: int, micro_batches: int, recompute: bool,
                 schedule: PipelineSchedule, dp_bytes_per_value: float | None) -> StageCosts:
    return StageCosts(model, d_pp=d_pp, d_dp=d_dp, micro_batches=micro_batches, recompute=recompute,
                      schedule=schedule, dp_bytes_per_value=dp_bytes_per_value)


def stage_memory_bytes(model: ModelConfig, *, d_pp: int, d_dp: int, execution: Execution | None = None
                       ) -> list[float]:
    """Bytes a peer needs to train each stage: parameters with optimizer state, plus stored activations."""
    execution = execution or Execution.even(model, d_pp)
    costs = StageCosts.of(model, execution, d_dp=d_dp)
    return costs.at(costs.memory_bytes, execution.layer_counts).tolist()


def stage_compute_s(model: ModelConfig, grid: np.ndarray, tflops: np.ndarray, execution: Execution | None = None
                    ) -> np.ndarray:
    """(d_pp, d_dp) seconds each device of the grid computes its stage per step.

    Args:
        grid: (d_pp, d_dp) device ids, grid[s, r] runs stage s of pipeline r.
        tflops: (N,) measured TFLOPS of every device.
    """
    d_pp, d_dp = grid.shape
    execution = execution or Execution.even(model, d_pp)
    costs = StageCosts.of(model, execution, d_dp=d_dp)
    speed = tflops[grid]  # (d_pp, d_dp)
    if (speed <= 0).any():
        stage, replica = np.argwhere(speed <= 0)[0]
        raise NoFeasiblePlan(f"device {grid[stage, replica]} of stage {stage} has no measured TFLOPS")
    return costs.at(costs.flops, execution.layer_counts)[:, None] / (speed * 1e12)


def pipeline_terms(stage_s: np.ndarray, hop_s: np.ndarray, *, micro_batches: int, recompute: bool
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(compute, bubble, pipeline communication), each (...,): Φ(f) + Φ(b) of one pipeline (module docstring),
    split so that compute and bubble are its slowest stage's time and GPipe's fill and drain, and the rest is what
    its hops add.

    Args:
        stage_s: (..., d_pp) each stage's compute per step, in stage order.
        hop_s: (..., d_pp − 1) each hop's time for one micro-batch, in stage order.
    """
    backward = stage_s * _BACKWARD_SHARE[recompute] / micro_batches
    forward = stage_s / micro_batches - backward

    def phase(passes: np.ndarray) -> np.ndarray:
        slowest = np.maximum(passes.max(axis=-1), hop_s.max(axis=-1, initial=0.0))
        return passes.sum(axis=-1) + hop_s.sum(axis=-1) + (micro_batches - 1) * slowest

    compute = stage_s.max(axis=-1)
    bubble = (stage_s.sum(axis=-1) - compute) / micro_batches
    return compute, bubble, phase(forward) + phase(backward) - compute - bubble


def step_terms(stage_s: np.ndarray, hop_s: np.ndarray, allreduce_s: np.ndarray, *, micro_batches: int,
               recompute: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(DataP, pipeline communication, compute, bubble), each (...,), of pipelines that run side by side until
    their stage groups' all-reduces (module docstring).

    Each pipeline r ends its pass at its own makespan T_r = Φ_r(f) + Φ_r(b). Stage s's replica in it ends its
    backward pass Σ_{j<s} b_jr before that (the last micro-batch's gradients still cross the stages before it),
    and the group starts its all-reduce when its last replica has: the step's work ends at
    max_s (max_r (T_r − Σ_{j<s} b_jr) + A_s). The slowest pipeline's terms are reported, and DataP is what the
    all-reduces add to its T_r (at least stage 0's: nothing hides it).

    Args:
        stage_s: (..., d_dp, d_pp) each pipeline's stages' compute per step.
        hop_s: (..., d_dp, d_pp − 1) each pipeline's hops' time for one micro-batch.
        allreduce_s: (..., d_pp) each stage group's all-reduce.
    """
    runs = {"micro_batches": micro_batches, "recompute": recompute}
    compute, bubble, pipe = pipeline_terms(stage_s, hop_s, **runs)  # (..., d_dp)
    makespan = compute + bubble + pipe
    backward = stage_s * _BACKWARD_SHARE[recompute] / micro_batches
    lead = np.cumsum(backward, axis=-1) - backward  # Σ_{j<s}, (..., d_dp, d_pp)
    started = (makespan[..., None] - lead).max(axis=-2)  # (..., d_pp)
    slowest = np.argmax(makespan, axis=-1)[..., None]

    def of_slowest(term: np.ndarray) -> np.ndarray:
        return np.take_along_axis(term, slowest, axis=-1)[..., 0]

    data = (started + allreduce_s).max(axis=-1) - makespan.max(axis=-1)
    return data, of_slowest(pipe), of_slowest(compute), of_slowest(bubble)


def exposed_vote_s(vote_s: float, compute_s: np.ndarray, *, d_pp: int) -> np.ndarray:
    """The commit vote's part of the step (`vote_s`, the farthest pair's latency): all of it, but on a single
    stage only what outlasts the next step's passes (`compute_s`, its slowest replica's), which run while the
    plan votes (client/training/stage_worker.py)."""
    return np.maximum(vote_s - compute_s, 0.0) if d_pp == 1 else np.full_like(compute_s, vote_s)


def predict_step_s(plan: Plan, model: ModelConfig, *, tflops: np.ndarray, memory_gib: np.ndarray,
                   latency_ms: np.ndarray | None = None, execution: Execution | None = None,
                   slowest_hops: bool = False) -> LiveBreakdown:
    """The live model's step time of a deployed plan (module docstring); `plan.breakdown` is its paper cost (for
    an uneven cut, priced with each stage's own payload: `cost_plan`'s `stage_dp_bytes`).

    Args:
        tflops, memory_gib: (N,) per device, indexed like the plan's grid.
        latency_ms: (N, N) measured latencies, for the commit vote; None leaves it out (a plan priced for the
            paper's comparisons).
        execution: the plan's cut, micro-batches and recomputation; None: the model's even cut and micro-batches.
        slowest_hops: charge every pipeline each hop of the slowest pipeline at that stage boundary, as the
            search's objective does (coordinator/scheduling/live_objective.py), instead of its own.

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
    stage_s = stage_compute_s(model, grid, np.asarray(tflops, dtype=float), execution)
    hop_s = plan.micro_batch_hops_s(execution.micro_batches).T  # (d_dp, d_pp − 1)
    if slowest_hops:
        hop_s = np.broadcast_to(hop_s.max(axis=0), hop_s.shape)
    data, pipe, compute, bubble = step_terms(stage_s.T, hop_s, plan.stage_allreduce_s,
                                             micro_batches=execution.micro_batches, recompute=execution.recompute)
    vote_s = 0.0 if latency_ms is None else float(np.asarray(latency_ms)[np.ix_(grid.ravel(), grid.ravel())].max())
    return LiveBreakdown(
        data_parallel_s=float(data),
        pipeline_parallel_s=float(pipe),
        compute_s=float(compute),
        bubble_s=float(bubble),
        commit_s=float(exposed_vote_s(vote_s / 1000, compute, d_pp=d_pp)),
    )
