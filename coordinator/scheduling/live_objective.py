"""The live cost model as the search's objective, so that plans are made for the devices that are there.

The paper's objective prices communication only (coordinator/scheduling/cost_model.py); on a swarm of mixed GPUs it will put a
slow device into every stage group, and every stage then runs at that device's speed. `LiveCostModel` gives the
search (coordinator/scheduling/search.py) the step time of coordinator/scheduling/live_cost.py instead, through the same three hooks:

- a group's term is a row: seconds per FLOP of its slowest device, the memory of its smallest, and its all-reduce
  (slowest pair, PaperCostModel.concurrent_allreduce_s) at every stage position and layer count, so that a stage's
  all-reduce is priced by indexing at whatever payload its layers give it;
- a pair of groups is linked by the paper's bottleneck matching, of one micro-batch's activations (`hops`);
- `combine` puts the groups in stage order, cuts the layers (`balanced_cut`: a group of slow or small devices
  holds fewer; or the even cut, whichever is faster) and adds the live model's terms (live_cost.step_terms) for
  one pipeline made of each stage's slowest device and each hop's slowest pipeline: the forward and backward over
  stages and hops, the all-reduces they do not hide, and the commit vote (on a single stage, what the next step's
  compute does not hide). That bounds the deployed plan's step
  from above (its pipelines are each at most that slow) and equals it when every stage group's devices are
  equally fast, which is what the search favours. Plus
  `PENALTY_S_PER_GIB` for every GiB a stage lacks on its smallest device, so that the search walks out of
  infeasible placements instead of seeing a wall. The order is the best of all orders for up to
  `EXACT_ORDER_MAX_STAGES` stages; beyond, the cheapest open path of the links, either way round (first and last
  stages hold the embedding and the head, so the direction matters).

A model is searched with one way of running its stages (`execution_options`: schedule, micro-batches,
recomputation), chosen by coordinator/scheduling/scheduler.py, which then runs the plan found the way chosen for it (the
first that fits unless a later one is clearly faster). Devices are interchangeable for the search only if they are
network twins with the same TFLOPS and memory.
"""
from __future__ import annotations

import heapq
import itertools
from collections.abc import Hashable
from dataclasses import dataclass

import numpy as np

from hetswarm.coordinator.scheduling.cost_model import PaperCostModel, spanning_tree_weight
from hetswarm.coordinator.scheduling.live_cost import (
    Execution,
    ExecutionOption,
    LiveBreakdown,
    NoFeasiblePlan,
    StageCosts,
    exposed_vote_s,
    stage_memory_bytes,
    step_terms,
)
from hetswarm.coordinator.scheduling.tsp import shortest_path
from hetswarm.protocol.model_config import ModelConfig
from hetswarm.protocol.units import BYTES_PER_GB, BYTES_PER_GIB

__all__ = ["EXACT_ORDER_MAX_STAGES", "Hardware", "LiveCost", "LiveCostModel", "PENALTY_S_PER_GIB",
           "execution_options", "fitting"]

PENALTY_S_PER_GIB = 1e9
"""Seconds added per GiB a stage lacks (about a second per byte): a plan that fits beats any that does not."""
EXACT_ORDER_MAX_STAGES = 4
"""Up to this many stages `combine` tries every stage order (24 at most)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Hardware:
    """What the live objective knows of the devices besides their links: one entry per device of the network."""

    model: ModelConfig
    tflops: np.ndarray
    """(N,) dense 16-bit TFLOPS, measured or claimed."""
    memory_gib: np.ndarray
    """(N,) memory for the stage."""


@dataclass(frozen=True, kw_only=True, slots=True)
class LiveCost:
    """A partition's live step time and how far it is from fitting; `total_s` is what the search minimises."""

    live: LiveBreakdown
    layer_counts: tuple[int, ...]
    """The cut priced, in stage order."""
    short_gib: float = 0.0
    """GiB the stages lack on their smallest devices, summed; 0 for a plan that fits."""

    @property
    def total_s(self) -> float:
        return self.live.total_s + PENALTY_S_PER_GIB * self.short_gib


class LiveCostModel:
    """The live step time of a partition (module docstring), as a `CostEvaluator` over a paper model's links.

    Args:
        option: how the stages run (live_cost.Execution); None: the model's own way (GPipe, its micro-batches).
        balanced: cut the layers for each placement (`balanced_cut`, or the even cut where that is faster); else
            the model's even cut.
    """

    def __init__(self, paper: PaperCostModel, hardware: Hardware, *, option: ExecutionOption | None = None,
                 balanced: bool = False) -> None:
        tflops, memory = np.asarray(hardware.tflops, dtype=float), np.asarray(hardware.memory_gib, dtype=float)
        if tflops.shape != (paper.n_devices,) or memory.shape != (paper.n_devices,):
            raise ValueError(f"need TFLOPS and memory for each of {paper.n_devices} devices, got {tflops.shape} and "
                             f"{memory.shape}")
        if (tflops <= 0).any():
            raise NoFeasiblePlan(f"device {int(np.argmin(tflops))} has no measured TFLOPS")
        self.paper, self.tflops, self.memory_gib, self.balanced = paper, tflops, memory, balanced
        self.d_dp, self.d_pp, self.n_devices = paper.d_dp, paper.d_pp, paper.n_devices
        model = hardware.model
        self.even = Execution.even(model, self.d_pp, **(option or ExecutionOption(model.micro_batches))._asdict())
        self.hops = paper.with_pp_bytes(paper.payloads.pp_bytes / self.even.micro_batches)
        """The links between groups carry one micro-batch at a time: plans are matched on these hop times
        (plan_from_partition's `matched_by`)."""
        costs = StageCosts.of(model, self.even, d_dp=self.d_dp)
        self.micro_batches, self.recompute = self.even.micro_batches, self.even.recompute
        self.flops = costs.flops  # (d_pp, L + 1)
        self._first_count = 1 if balanced else self.even.layer_counts[0]  # the fewest layers stage 0 may hold
        self.need_gib = costs.memory_bytes / BYTES_PER_GIB  # (d_pp, L + 1)
        wire_scale = paper.payloads.dp_bytes / model.dp_payload_bytes(self.d_pp)  # the wire's bytes per value
        self.dp_gb = costs.dp_bytes * wire_scale / BYTES_PER_GB  # (d_pp, L + 1)
        self.total_flops = float(costs.at(costs.flops, self.even.layer_counts).sum())  # the same for any cut
        self.commit_s = float(paper.network.latency_ms.max()) / 1000  # every device is placed: the farthest pair
        hardware_class = np.unique(np.stack([paper.network.twin_classes, tflops, memory], axis=1), axis=0,
                                   return_inverse=True)[1]
        self.classes = np.asarray(hardware_class).reshape(-1)
        """(N,) devices of one class are network twins with equal TFLOPS and memory."""
        self._orders = np.array(list(itertools.permutations(range(self.d_pp)))) \
            if self.d_pp <= EXACT_ORDER_MAX_STAGES else None

    def execution(self, cost: LiveCost) -> Execution:
        """How a plan the search found runs."""
        return Execution(layer_counts=cost.layer_counts, **self.even.option._asdict())

    def group_key(self, group: np.ndarray) -> Hashable:
        return np.sort(self.classes[group]).tobytes()

    def group_time_s(self, group: np.ndarray) -> np.ndarray:
        """(2 + D_PP·(L + 1),): seconds per FLOP of its slowest device, its smallest memory (GiB), and its
        all-reduce time as stage s with l layers at [2 + s·(L + 1) + l]."""
        block = np.ix_(group, group)
        latency, per_gb = self.paper.dp_latency_s[block].ravel(), self.paper.dp_s_per_gb[block].ravel()
        slowest = _envelope(latency, per_gb)
        allreduce = (latency[slowest] + self.dp_gb[:, :, None] * per_gb[slowest]).max(axis=2)  # (d_pp, L + 1)
        return np.concatenate([[1 / (self.tflops[group].min() * 1e12), self.memory_gib[group].min()],
                               allreduce.ravel()])

    def _allreduce_s(self, rows: np.ndarray, counts: np.ndarray) -> np.ndarray:
        """(..., d_pp) all-reduce seconds of groups in stage order (their rows (..., d_pp, ·)) with their cuts."""
        stages = np.arange(self.d_pp)
        return np.take_along_axis(rows, (2 + stages * self.flops.shape[1] + counts)[..., None], axis=-1)[..., 0]

    def group_bound_s(self, group_times_s: np.ndarray) -> float:
        """The first stage's all-reduce (nothing hides it) at its fewest layers in the fastest group, the compute no
        cut can beat, and the vote: below any total."""
        s_per_flop = group_times_s[:, 0]
        if self.balanced:  # the slowest stage takes at least the average: total work over total speed
            compute = self.total_flops / (1 / s_per_flop).sum()
        else:  # each group takes at least the lightest stage of the even cut
            compute = float(self.flops[np.arange(self.d_pp), list(self.even.layer_counts)].min() * s_per_flop.max())
        first_allreduce = group_times_s[:, 2 + self._first_count].min()
        return float(first_allreduce + compute + exposed_vote_s(self.commit_s, compute, d_pp=self.d_pp))

    def link_terms_s(self, group_a: np.ndarray, group_b: np.ndarray) -> tuple[float, float]:
        return self.hops.link_terms_s(group_a, group_b)

    def link_bounds_s(self, group: np.ndarray, others: np.ndarray) -> np.ndarray:
        return self.hops.link_bounds_s(group, others)

    def combine(self, group_times_s: np.ndarray, link_times_s: np.ndarray) -> tuple[LiveCost, list[int]]:
        if self._orders is not None:
            orders = self._orders
        else:
            _, path = shortest_path(link_times_s)
            orders = np.array([path, path[::-1]])
        counts = np.tile(self.even.layer_counts, (len(orders), 1))
        if self.balanced:  # each order with its balanced cut, and with the even one: whichever is faster
            orders = np.concatenate([orders, orders])
            counts = np.concatenate([np.array([self.balanced_cut(group_times_s[order]) for order in orders[:len(counts)]]),
                                     counts])
        totals, parts = self._priced(group_times_s, link_times_s, orders, counts)
        best = int(np.argmin(totals))
        data_s, pipe_s, compute_s, bubble_s, commit_s, short_gib = (float(part[best]) for part in parts)
        live = LiveBreakdown(data_parallel_s=data_s, pipeline_parallel_s=pipe_s, compute_s=compute_s,
                             bubble_s=bubble_s, commit_s=commit_s)
        return (LiveCost(live=live, layer_counts=tuple(int(c) for c in counts[best]), short_gib=short_gib),
                [int(g) for g in orders[best]])

    def lower_bound_s(self, group_times_s: np.ndarray, link_times_s: np.ndarray) -> float:
        """`group_bound_s` + 2·MST: no stage order's path is lighter than a minimum spanning tree."""
        return self.group_bound_s(group_times_s) + 2 * spanning_tree_weight(link_times_s)

    def balanced_cut(self, stage_rows: np.ndarray) -> tuple[int, ...]:
        """Layers per stage for groups in stage order (their `group_time_s` rows), each stage at least one: the cut
        with the smallest largest stage time, compute plus its all-reduce, within every group's memory. Adding
        layers one at a time to the stage that stays fastest is optimal for that, since every stage's time grows
        with its layers. The even cut when no cut fits."""
        d_pp, n_layers = self.d_pp, self.flops.shape[1] - 1
        stages = np.arange(d_pp)
        s_per_flop, memory = stage_rows[:, 0], stage_rows[:, 1]
        allreduce = stage_rows[:, 2:].reshape(d_pp, d_pp, n_layers + 1)[stages, stages]  # (d_pp, L + 1)
        time_s = self.flops * s_per_flop[:, None] + allreduce  # (d_pp, L + 1), increasing in the layers
        cap = (self.need_gib <= memory[:, None]).sum(axis=1) - 1  # most layers each stage's group can hold
        if (cap < 1).any() or cap.sum() < n_layers:
            return self.even.layer_counts
        counts = np.ones(d_pp, dtype=int)
        growing = [(time_s[s, 2], int(s)) for s in stages if cap[s] > 1]
        heapq.heapify(growing)
        for _ in range(n_layers - d_pp):
            _, stage = heapq.heappop(growing)
            counts[stage] += 1
            if counts[stage] < cap[stage]:
                heapq.heappush(growing, (time_s[stage, counts[stage] + 1], stage))
        return tuple(int(c) for c in counts)

    def _priced(self, group_times_s: np.ndarray, link_times_s: np.ndarray, orders: np.ndarray, counts: np.ndarray
                ) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
        """(P,) totals of P stage orders (P, d_pp) with their cuts (P, d_pp), and the terms (data, pipe, compute,
        bubble, commit, short GiB)."""
        stages = np.arange(self.d_pp)[None, :]
        rows = group_times_s[orders]  # (P, d_pp, 2 + d_pp·(L + 1))
        stage_s = self.flops[stages, counts] * rows[:, :, 0]  # (P, d_pp)
        short = np.maximum(self.need_gib[stages, counts] - rows[:, :, 1], 0.0).sum(axis=1)
        runs = {"micro_batches": self.micro_batches, "recompute": self.recompute}
        hop_s = link_times_s[orders[:, :-1], orders[:, 1:]]  # (P, d_pp − 1), each hop at its slowest pipeline
        data, pipe, compute, bubble = step_terms(stage_s[:, None], hop_s[:, None], self._allreduce_s(rows, counts),
                                                 **runs)
        commit = exposed_vote_s(self.commit_s, compute, d_pp=self.d_pp)
        totals = data + pipe + compute + bubble + commit + PENALTY_S_PER_GIB * short
        return totals, (data, pipe, compute, bubble, commit, short)


def _envelope(latency: np.ndarray, per_gb: np.ndarray) -> np.ndarray:
    """Indices of the pairs that are the slowest at some payload: those no other pair beats in both its latency and
    its seconds per GB (the upper envelope of the lines latency + payload · per_gb, payload ≥ 0)."""
    order = np.lexsort((-latency, -per_gb))  # steepest first, the slower of equal slopes first
    sorted_latency = latency[order]
    before = np.maximum.accumulate(np.concatenate([[-np.inf], sorted_latency[:-1]]))
    return order[sorted_latency > before]


def execution_options(model: ModelConfig, d_dp: int) -> list[ExecutionOption]:
    """Ways to run the stages, least change first: the model's own (GPipe); 1F1B, which holds fewer micro-batches
    at once for the same step time (live_cost, Memory); 1F1B with more micro-batches, each smaller; then with
    recomputation, for a third more compute, with as many micro-batches again (up to one sequence each).
    Memory moves a plan down this list, and so does a clear predicted gain (scheduler.WAY_MARGIN: the live model
    charges a latency per micro-batch and hop but no fixed cost per pass, so it favours many micro-batches)."""
    sequences = max(1, int(model.batch_tokens / d_dp / model.seq_len))
    counts = [count for count in dict.fromkeys([*(min(model.micro_batches * k, sequences) for k in (1, 4, 16)),
                                                sequences]) if count >= model.micro_batches]
    return [ExecutionOption(model.micro_batches),
            *(ExecutionOption(count, schedule="1f1b") for count in counts),
            *(ExecutionOption(count, recompute=True, schedule="1f1b") for count in counts)]


def fitting(model: ModelConfig, memory_gib: np.ndarray) -> Execution:
    """The model's even cut, run the first way (`execution_options`) in which every stage fits the memory of its
    peers (`memory_gib`, (d_pp, d_dp) as placed); the model's own way when none does (pricing then says why)."""
    d_pp, d_dp = memory_gib.shape
    options = [Execution.even(model, d_pp, **option._asdict()) for option in execution_options(model, d_dp)]
    for execution in options:
        need_gib = np.asarray(stage_memory_bytes(model, d_pp=d_pp, d_dp=d_dp, execution=execution)) / BYTES_PER_GIB
        if (memory_gib >= need_gib[:, None]).all():
            return execution
    return options[0]
