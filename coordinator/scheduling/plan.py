"""A deployment: which device runs which (stage, replica), and what it costs as deployed.

`cost_plan` prices any grid the same way, so the search's plans, the baselines and a live plan compare on one
model. A plan built from a partition chains the bottleneck matchings along the stage order, so its pipelines
really achieve the cost the model gives the partition (the reference deploys a different matching; docs/dtfm.md,
Defects).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from hetswarm.coordinator.scheduling.cost_model import CostBreakdown, InvalidPlanShape, PaperCostModel, edge_time_s
from hetswarm.protocol.units import BYTES_PER_GB

__all__ = ["BottleneckLink", "Plan", "cost_plan", "plan_from_partition"]


@dataclass(frozen=True, kw_only=True, slots=True)
class BottleneckLink:
    """The slowest hop between adjacent stages of one pipeline: it sets that stage boundary's time."""

    stage: int
    """The hop goes from stage `stage` to stage `stage + 1`."""
    pipeline: int
    devices: tuple[int, int]
    time_s: float


@dataclass(frozen=True, kw_only=True, slots=True)
class Plan:
    """Stage × replica grid of device ids, with its cost as deployed."""

    grid: np.ndarray
    """(d_pp, d_dp): grid[s, r] runs stage s of pipeline r. Row s is stage group C_s; column r is pipeline r."""
    sites: tuple[tuple[str, ...], ...]
    """Site name of every grid cell, for people reading the plan."""
    breakdown: CostBreakdown
    data_parallel_critical: tuple[int, int]
    """(stage, device) whose sharded all-reduce is slowest: it sets DataP."""
    bottleneck: BottleneckLink | None
    """The slowest pipeline hop of the whole plan; None with a single stage."""
    stage_allreduce_s: np.ndarray
    """(d_pp,) each stage group's all-reduce with its sends concurrent, as the runtime runs it (the live model's;
    PaperCostModel.concurrent_allreduce_s)."""
    hop_latency_s: np.ndarray
    """(d_pp − 1, d_dp) one-way latency of every pipeline hop, stage s → s + 1 of pipeline r."""
    hop_s_per_gb: np.ndarray
    """(d_pp − 1, d_dp) seconds per GB of every pipeline hop."""
    pp_gb: float | np.ndarray
    """c_PP in GB: one pipeline's activations across a stage boundary in a step; (d_pp − 1, d_dp) per hop where
    the hops' codecs differ (protocol/wire_format.py, per link)."""

    def micro_batch_hops_s(self, micro_batches: int) -> np.ndarray:
        """(d_pp − 1, d_dp) every pipeline hop's time for one micro-batch's activations (or their gradients): the
        live model's per-hop term (coordinator/scheduling/live_cost.py)."""
        return self.hop_latency_s + self.pp_gb / micro_batches * self.hop_s_per_gb

    @property
    def cost_s(self) -> float:
        return self.breakdown.total_s

    @property
    def stages(self) -> list[list[int]]:
        return self.grid.tolist()

    @property
    def pipelines(self) -> list[list[int]]:
        return self.grid.T.tolist()

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: what an Assignment needs (stages, pipelines) and what a person reads (sites, costs)."""
        stage, device = self.data_parallel_critical
        return {
            "cost": self.cost_s,
            "data_parallel_s": self.breakdown.data_parallel_s,
            "pipeline_parallel_s": self.breakdown.pipeline_parallel_s,
            "d_pp": int(self.grid.shape[0]),
            "d_dp": int(self.grid.shape[1]),
            "stages": self.stages,
            "pipelines": self.pipelines,
            "sites": [list(row) for row in self.sites],
            "data_parallel_critical": {"stage": stage, "device": device},
            "bottleneck_link": None if self.bottleneck is None else {
                "stage": self.bottleneck.stage,
                "pipeline": self.bottleneck.pipeline,
                "devices": list(self.bottleneck.devices),
                "time_s": self.bottleneck.time_s,
            },
        }


def cost_plan(model: PaperCostModel, grid: np.ndarray, stage_dp_bytes: np.ndarray | None = None,
              hop_pp_bytes: np.ndarray | None = None, allreduce_rounds: int = 1) -> Plan:
    """Prices a grid as deployed: DataP over its rows, and each stage boundary at its slowest pipeline hop.

    No re-matching and no re-ordering happens here: a baseline is charged for the pipelines it actually builds.

    Args:
        stage_dp_bytes: (d_pp,) each stage's all-reduce payload, for stages cut unevenly or groups in codecs of
            their own; None: c_DP for all.
        hop_pp_bytes: (d_pp − 1, d_dp) each hop's c_PP, for hops in codecs of their own; None: c_PP for all.
        allreduce_rounds: the rounds of each all-reduce (the wire's: protocol/wire_format.py), each paying the
            links' latency.
    """
    grid = model.checked_partition(grid)
    group_sums = model.member_times_s(grid, stage_dp_bytes, allreduce_rounds)  # (d_pp, d_dp)
    stage, replica = np.unravel_index(np.argmax(group_sums), group_sums.shape)
    network = model.network
    pairs = grid[:-1], grid[1:]  # (d_pp - 1, d_dp) each: stage s → s+1 of pipeline r
    if hop_pp_bytes is None:  # every hop at c_PP: the model's precomputed link times
        pp_gb, hops = model.payloads.pp_bytes / BYTES_PER_GB, model.pp_edge_s[pairs]
    else:
        pp_gb = np.asarray(hop_pp_bytes) / BYTES_PER_GB
        hops = edge_time_s(network.latency_ms[pairs], network.bandwidth_gbps[pairs], pp_gb)
    bottleneck = None
    if len(hops):
        hop_stage, pipeline = np.unravel_index(np.argmax(hops), hops.shape)
        bottleneck = BottleneckLink(
            stage=int(hop_stage),
            pipeline=int(pipeline),
            devices=(int(grid[hop_stage, pipeline]), int(grid[hop_stage + 1, pipeline])),
            time_s=float(hops[hop_stage, pipeline]),
        )
    sites = network.sites
    return Plan(
        grid=grid,
        sites=tuple(tuple(sites[device] for device in row) for row in grid),
        breakdown=CostBreakdown(
            data_parallel_s=float(group_sums.max()),
            pipeline_parallel_s=2 * float(hops.max(axis=1).sum()) if len(hops) else 0.0,
        ),
        data_parallel_critical=(int(stage), int(grid[stage, replica])),
        bottleneck=bottleneck,
        stage_allreduce_s=model.concurrent_allreduce_s(grid, stage_dp_bytes, allreduce_rounds),
        hop_latency_s=edge_time_s(network.latency_ms[pairs], np.inf, 0.0),
        hop_s_per_gb=edge_time_s(0.0, network.bandwidth_gbps[pairs], 1.0),
        pp_gb=pp_gb,
    )


def plan_from_partition(model: PaperCostModel, partition: np.ndarray, order: list[int],
                        stage_dp_bytes: np.ndarray | None = None, *, matched_by: PaperCostModel | None = None
                        ) -> Plan:
    """Deploys a partition along a stage order: pipeline r follows the bottleneck matchings from stage to stage.

    Args:
        partition: (d_pp, d_dp) stage groups, in any row order.
        order: order[s] is the row of `partition` that runs stage s (the open-path TSP's answer).
        stage_dp_bytes: (d_pp,) each stage's all-reduce payload (`cost_plan`).
        matched_by: whose hop times the matchings minimise (the live objective's are one micro-batch's,
            LiveCostModel.hops); None: `model`'s.
    """
    partition = model.checked_partition(partition)
    if sorted(order) != list(range(len(partition))):
        raise InvalidPlanShape(f"stage order {order} is not a permutation of the {len(partition)} groups")
    grid = np.empty_like(partition)
    grid[0] = partition[order[0]]
    for stage in range(1, len(order)):
        group = partition[order[stage]]
        _, assignment = (matched_by or model).link_matching(grid[stage - 1], group)  # grid[stage-1][r] feeds group[assignment[r]]
        grid[stage] = group[assignment]
    return cost_plan(model, grid, stage_dp_bytes)
