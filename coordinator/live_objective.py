"""The live cost model as the search's objective, so that plans are made for the devices that are there.

The paper's objective prices communication only (coordinator/cost_model.py); on a swarm of mixed GPUs it will put a
slow device into every stage group, and every stage then runs at that device's speed. `LiveCostModel` gives the
search (coordinator/search.py) the step time of coordinator/live_cost.py instead, through the same three hooks:

- a group's term is a row (all-reduce s, compute floor s, smallest memory GiB): its paper all-reduce time; the
  seconds its slowest device takes for the lightest stage, F_min · B / D_DP / min TFLOPS (a stage's time at
  position s is that times F_s / F_min, since a group computes at its slowest member's pace); and the memory of its
  smallest device;
- a pair of groups is linked by the paper's bottleneck matching, as before;
- `combine` puts the groups in stage order and adds the live model's terms: DataP + 2·PipeP + the slowest stage's
  compute + GPipe's bubble + the commit vote, plus `PENALTY_S_PER_GIB` for every GiB a stage lacks on its smallest
  device, so that the search walks out of infeasible placements instead of seeing a wall. The order is the best of
  all orders for up to `EXACT_ORDER_MAX_STAGES` stages; beyond, the cheapest open path of the links, either way
  round (first and last stages hold the embedding and the head, so the direction matters).

Devices are interchangeable for the search only if they are network twins with the same TFLOPS and memory.
"""
from __future__ import annotations

import itertools
from collections.abc import Hashable
from dataclasses import dataclass

import numpy as np

from hetswarm.coordinator.cost_model import PaperCostModel, spanning_tree_weight
from hetswarm.coordinator.live_cost import LiveBreakdown, NoFeasiblePlan, stage_memory_bytes
from hetswarm.coordinator.tsp import shortest_path
from hetswarm.protocol.model_config import ModelConfig
from hetswarm.protocol.units import BYTES_PER_GIB

__all__ = ["EXACT_ORDER_MAX_STAGES", "Hardware", "LiveCost", "LiveCostModel", "PENALTY_S_PER_GIB"]

PENALTY_S_PER_GIB = 1e4
"""Seconds added per GiB a stage lacks: more than any feasible step, so a plan that fits always wins."""
EXACT_ORDER_MAX_STAGES = 6
"""Up to this many stages `combine` tries every stage order (720 at most, one numpy pass)."""


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
    short_gib: float = 0.0
    """GiB the stages lack on their smallest devices, summed; 0 for a plan that fits."""

    @property
    def total_s(self) -> float:
        return self.live.total_s + PENALTY_S_PER_GIB * self.short_gib


class LiveCostModel:
    """The live step time of a partition (module docstring), as a `CostEvaluator` over a paper model's links."""

    def __init__(self, paper: PaperCostModel, hardware: Hardware) -> None:
        tflops, memory = np.asarray(hardware.tflops, dtype=float), np.asarray(hardware.memory_gib, dtype=float)
        if tflops.shape != (paper.n_devices,) or memory.shape != (paper.n_devices,):
            raise ValueError(f"need TFLOPS and memory for each of {paper.n_devices} devices, got {tflops.shape} and "
                             f"{memory.shape}")
        if (tflops <= 0).any():
            raise NoFeasiblePlan(f"device {int(np.argmin(tflops))} has no measured TFLOPS")
        self.paper, self.tflops, self.memory_gib = paper, tflops, memory
        self.d_dp, self.d_pp, self.n_devices = paper.d_dp, paper.d_pp, paper.n_devices
        model = hardware.model
        flops = np.asarray(model.stage_flops_per_token(self.d_pp)) * model.batch_tokens / self.d_dp  # (d_pp,)
        self.flops_ratio = flops / flops.min()  # (d_pp,) stage s takes this many times the lightest stage
        self.floor_flops = float(flops.min())
        self.need_gib = np.asarray(stage_memory_bytes(model, d_pp=self.d_pp, d_dp=self.d_dp)) / BYTES_PER_GIB
        self.micro_batches = model.micro_batches
        latency = paper.network.latency_ms
        self.commit_s = float(latency.max()) / 1000  # every device is placed: the farthest pair votes last
        hardware_class = np.unique(np.stack([paper.network.twin_classes, tflops, memory], axis=1), axis=0,
                                   return_inverse=True)[1]
        self.classes = np.asarray(hardware_class).reshape(-1)
        """(N,) devices of one class are network twins with equal TFLOPS and memory."""
        self._orders = np.array(list(itertools.permutations(range(self.d_pp)))) \
            if self.d_pp <= EXACT_ORDER_MAX_STAGES else None

    def group_key(self, group: np.ndarray) -> Hashable:
        return np.sort(self.classes[group]).tobytes()

    def group_time_s(self, group: np.ndarray) -> np.ndarray:
        """(3,): all-reduce seconds, compute floor seconds, smallest memory GiB (module docstring)."""
        floor_s = self.floor_flops / (self.tflops[group].min() * 1e12)
        return np.array([self.paper.group_time_s(group), floor_s, self.memory_gib[group].min()])

    def group_bound_s(self, group_times_s: np.ndarray) -> float:
        """DataP + the slowest group's compute floor + the vote: below any total with these groups."""
        return float(group_times_s[:, 0].max() + group_times_s[:, 1].max() + self.commit_s)

    def link_terms_s(self, group_a: np.ndarray, group_b: np.ndarray) -> tuple[float, float]:
        return self.paper.link_terms_s(group_a, group_b)

    def link_bounds_s(self, group: np.ndarray, others: np.ndarray) -> np.ndarray:
        return self.paper.link_bounds_s(group, others)

    def combine(self, group_times_s: np.ndarray, link_times_s: np.ndarray) -> tuple[LiveCost, list[int]]:
        if self._orders is not None:
            orders = self._orders
        else:
            _, path = shortest_path(link_times_s)
            orders = np.array([path, path[::-1]])
        totals, parts = self._priced_orders(group_times_s, link_times_s, orders)
        best = int(np.argmin(totals))
        data_s, pipe_s, compute_s, bubble_s, short_gib = (float(part[best]) for part in parts)
        live = LiveBreakdown(data_parallel_s=data_s, pipeline_parallel_s=pipe_s, compute_s=compute_s,
                             bubble_s=bubble_s, commit_s=self.commit_s)
        return LiveCost(live=live, short_gib=short_gib), [int(g) for g in orders[best]]

    def lower_bound_s(self, group_times_s: np.ndarray, link_times_s: np.ndarray) -> float:
        """`group_bound_s` + 2·MST: no stage order's path is lighter than a minimum spanning tree."""
        return self.group_bound_s(group_times_s) + 2 * spanning_tree_weight(link_times_s)

    def _priced_orders(self, group_times_s: np.ndarray, link_times_s: np.ndarray, orders: np.ndarray
                       ) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
        """(P,) totals of P stage orders (P, d_pp), and their terms (data, pipe, compute, bubble, short GiB)."""
        data = np.full(len(orders), group_times_s[:, 0].max())
        pipe = 2 * link_times_s[orders[:, :-1], orders[:, 1:]].sum(axis=1)
        stage_s = group_times_s[orders, 1] * self.flops_ratio  # (P, d_pp)
        compute = stage_s.max(axis=1)
        bubble = (stage_s.sum(axis=1) - compute) / self.micro_batches
        short = np.maximum(self.need_gib - group_times_s[orders, 2], 0.0).sum(axis=1)
        totals = data + pipe + compute + bubble + self.commit_s + PENALTY_S_PER_GIB * short
        return totals, (data, pipe, compute, bubble, short)

