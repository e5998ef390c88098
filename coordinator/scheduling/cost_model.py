"""What a plan costs: DT-FM's communication cost model (`paper` mode, docs/dtfm.md), as an evaluator the search calls.

The cost of a balanced partition of the devices into D_PP stage groups of D_DP is
    DataP + 2·PipeP,
where DataP is the slowest device's sharded all-reduce inside its group, and PipeP is the cheapest open path through
the groups on the coarsened graph whose edge (j, k) is the bottleneck perfect matching between C_j and C_k.

The search sees only the `CostEvaluator` protocol: a per-group term, a per-pair-of-groups term, and how the two
combine. The live cost model (per-peer compute, micro-batch bubbles) plugs in by implementing the same three
(coordinator/scheduling/live_objective.py).
"""
from __future__ import annotations

import copy
from collections.abc import Hashable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Protocol

import numpy as np

from hetswarm.coordinator.scheduling.matching import bottleneck_matching
from hetswarm.coordinator.scheduling.tsp import shortest_path
from hetswarm.protocol.errors import ConfigError, RejectedInput
from hetswarm.protocol.model_config import ModelConfig
from hetswarm.protocol.network import Network
from hetswarm.protocol.units import BYTES_PER_GB

if TYPE_CHECKING:  # the scheduler imports no pydantic (tests/test_import_doors.py)
    from hetswarm.protocol.wire_format import WireFormat

__all__ = ["CostBreakdown", "CostEvaluator", "InvalidPlanShape", "PaperCostModel", "Payloads", "edge_time_s",
           "spanning_tree_weight"]



class InvalidPlanShape(RejectedInput):
    """D_DP · D_PP does not equal the number of devices, or a degree is not positive."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Payloads:
    """Bytes each kind of transfer carries per training step; both cost modes price the same two numbers."""

    dp_bytes: float
    """c_DP: gradient bytes one stage group all-reduces (the largest stage's)."""
    pp_bytes: float
    """c_PP: activation bytes one pipeline sends across one stage boundary (and gradients back)."""

    def __post_init__(self) -> None:
        if not (self.dp_bytes > 0 and self.pp_bytes > 0):
            raise ConfigError(f"payloads must be positive bytes, got dp_bytes={self.dp_bytes}, pp_bytes={self.pp_bytes}")

    @classmethod
    def from_model(cls, model: ModelConfig, *, d_dp: int, d_pp: int, wire: WireFormat | None = None) -> Payloads:
        """The model's payloads at the bytes per value `wire` sends (protocol/wire_format.py), or at the model's
        own byte widths."""
        if wire is None:
            return cls(dp_bytes=model.dp_payload_bytes(d_pp), pp_bytes=model.pp_payload_bytes(d_dp))
        return cls(dp_bytes=max(wire.allreduce_payload_bytes(model, b - a, first=s == 0, last=s == d_pp - 1)
                                for s, (a, b) in enumerate(model.stage_layers(d_pp))),
                   pp_bytes=model.pp_payload_bytes(d_dp, wire.pipeline_bytes_per_value))


@dataclass(frozen=True, kw_only=True, slots=True)
class CostBreakdown:
    """Seconds per training step of communication, split as the paper splits it."""

    data_parallel_s: float
    """DataP: the slowest group's all-reduce."""
    pipeline_parallel_s: float
    """2·PipeP: activations forward plus their gradients backward along the stage order."""

    @property
    def total_s(self) -> float:
        return self.data_parallel_s + self.pipeline_parallel_s


class CostEvaluator(Protocol):
    """The cost of a partition as the search needs it: group terms, pair-of-group terms, and their combination."""

    d_dp: int
    d_pp: int
    n_devices: int

    def group_key(self, group: np.ndarray) -> Hashable:
        """Equal keys promise equal group and pair terms (the search caches on them)."""

    def group_time_s(self, group: np.ndarray) -> float | np.ndarray:
        """The term of one stage group on its own (paper: its all-reduce time), a number or a row of them."""

    def group_bound_s(self, group_times_s: np.ndarray) -> float:
        """A bound below any total with these group terms (whatever the links), to discard moves early."""

    def link_terms_s(self, group_a: np.ndarray, group_b: np.ndarray) -> tuple[float, float]:
        """(weight, smooth): the edge weight between two groups when they are adjacent stages (direction-free),
        and a companion that moves with every device (the weight, a bottleneck, does not); the search uses the
        second only to break ties, so that it can cross the plateaus of a max."""

    def link_bounds_s(self, group: np.ndarray, others: np.ndarray) -> np.ndarray:
        """(m,) cheap lower bounds on the link weights from `group` to each of m `others` (an (m, d_dp) array),
        tried before the exact weights to discard hopeless moves."""

    def combine(self, group_times_s: np.ndarray, link_times_s: np.ndarray) -> tuple[CostBreakdown, list[int]]:
        """The breakdown and the best stage order, from (d_pp,) group terms and the (d_pp, d_pp) link matrix."""

    def lower_bound_s(self, group_times_s: np.ndarray, link_times_s: np.ndarray) -> float:
        """A cheap bound below `combine`'s total, so the search can skip moves that cannot win."""


def edge_time_s(latency_ms: np.ndarray, bandwidth_gbps: np.ndarray, payload_gb: float) -> np.ndarray:
    """Seconds to send one payload over every link: tau = alpha/1000 + 8c/beta (docs/dtfm.md, Cost model)."""
    return latency_ms / 1000 + 8 * payload_gb / bandwidth_gbps  # (N, N), like both inputs


class PaperCostModel:
    """DT-FM's cost model on one network, with the per-link times precomputed once."""

    def __init__(self, network: Network, payloads: Payloads, *, d_dp: int, d_pp: int) -> None:
        if d_dp < 1 or d_pp < 1 or d_dp * d_pp != network.n_devices:
            raise InvalidPlanShape(
                f"D_DP × D_PP = {d_dp} × {d_pp} = {d_dp * d_pp}, but the network has {network.n_devices} devices; "
                "choose degrees whose product is the device count"
            )
        self.network, self.payloads = network, payloads
        self.d_dp, self.d_pp, self.n_devices = d_dp, d_pp, network.n_devices
        latency, bandwidth = network.latency_ms, network.bandwidth_gbps
        # Sharded all-reduce: each device sends a 1/D_DP shard to every other member twice (reduce-scatter,
        # all-gather), one after another: 2·(alpha/1000 + 8·c_DP/(D_DP·beta)) per peer, summed (docs/dtfm.md).
        # Kept as its latency part and its part per GB of payload, for stages whose payloads differ.
        self.dp_latency_s = 2 * edge_time_s(latency, bandwidth, 0.0)  # (N, N)
        self.dp_s_per_gb = 2 * edge_time_s(np.zeros_like(latency), bandwidth, 1.0 / d_dp)  # (N, N)
        for matrix in (self.dp_latency_s, self.dp_s_per_gb):
            np.fill_diagonal(matrix, 0.0)
        self.dp_edge_s = self.dp_latency_s + payloads.dp_bytes / BYTES_PER_GB * self.dp_s_per_gb  # (N, N)
        self.pp_edge_s = edge_time_s(latency, bandwidth, payloads.pp_bytes / BYTES_PER_GB)  # (N, N)
        self._classes = network.twin_classes

    def group_key(self, group: np.ndarray) -> Hashable:
        return np.sort(self._classes[group]).tobytes()

    def with_pp_bytes(self, pp_bytes: float) -> PaperCostModel:
        """The same model with another activation payload (the live model's one micro-batch): only the hop times
        differ, so the rest is shared, not recomputed."""
        other = copy.copy(self)
        other.payloads = replace(self.payloads, pp_bytes=pp_bytes)
        other.pp_edge_s = edge_time_s(self.network.latency_ms, self.network.bandwidth_gbps, pp_bytes / BYTES_PER_GB)
        return other

    def group_time_s(self, group: np.ndarray) -> float:
        return float(self.dp_edge_s[np.ix_(group, group)].sum(axis=1).max())

    def group_bound_s(self, group_times_s: np.ndarray) -> float:
        """DataP: the link terms are >= 0."""
        return float(group_times_s.max())

    def group_times_s(self, groups: np.ndarray, dp_bytes: np.ndarray | None = None) -> np.ndarray:
        """(m,) all-reduce time of each of m groups given as an (m, d_dp) array of device ids, at c_DP or at each
        group's own payload `dp_bytes` (m,)."""
        return self.member_times_s(groups, dp_bytes).max(axis=1)

    def member_times_s(self, groups: np.ndarray, dp_bytes: np.ndarray | None = None, rounds: int = 1) -> np.ndarray:
        """(m, d_dp): each member's sum of sends in its group's all-reduce (`group_times_s` is the row max), of
        `rounds` rounds that together send `dp_bytes` (a low-rank all-reduce takes two: protocol/wire_format.py)."""
        if dp_bytes is None and rounds == 1:
            return self.dp_edge_s[groups[:, :, None], groups[:, None, :]].sum(axis=2)
        dp_bytes = np.full(len(groups), self.payloads.dp_bytes) if dp_bytes is None else dp_bytes
        latency = rounds * self.dp_latency_s[groups[:, :, None], groups[:, None, :]].sum(axis=2)
        per_gb = self.dp_s_per_gb[groups[:, :, None], groups[:, None, :]].sum(axis=2)
        return latency + np.asarray(dp_bytes, dtype=float)[:, None] / BYTES_PER_GB * per_gb

    def concurrent_allreduce_s(self, groups: np.ndarray, dp_bytes: np.ndarray | None = None, rounds: int = 1
                               ) -> np.ndarray:
        """(m,) each group's all-reduce as the runtime runs it, for the live model (coordinator/scheduling/live_cost.py):
        hivemind's AllReduceRunner streams every shard to its reducer at once, each pair over its own path, so a
        group takes as long as its slowest pair's two sends, not a member's sum of them (`member_times_s`); a
        group of `rounds` rounds pays their latency that many times."""
        pairs = groups[:, :, None], groups[:, None, :]
        payload_gb = (np.full(len(groups), self.payloads.dp_bytes) if dp_bytes is None
                      else np.asarray(dp_bytes, dtype=float)) / BYTES_PER_GB
        latency = rounds * self.dp_latency_s[pairs]
        return (latency + payload_gb[:, None, None] * self.dp_s_per_gb[pairs]).max(axis=(1, 2))

    def link_terms_s(self, group_a: np.ndarray, group_b: np.ndarray) -> tuple[float, float]:
        block = self.pp_edge_s[np.ix_(group_a, group_b)]  # (d_dp, d_dp)
        smooth = (block.min(axis=1).mean() + block.min(axis=0).mean()) / 2  # each device's fastest partner
        return bottleneck_matching(block)[0], float(smooth)

    def link_bounds_s(self, group: np.ndarray, others: np.ndarray) -> np.ndarray:
        """Every device needs some partner: the slowest device's fastest link bounds the bottleneck from below."""
        blocks = self.pp_edge_s[group[None, :, None], others[:, None, :]]  # (m, d_dp, d_dp)
        return np.maximum(blocks.min(axis=2).max(axis=1), blocks.min(axis=1).max(axis=1))

    def link_matching(self, group_a: np.ndarray, group_b: np.ndarray) -> tuple[float, np.ndarray]:
        """Bottleneck time between two groups and the matching: group_a[i] feeds group_b[assignment[i]]."""
        return bottleneck_matching(self.pp_edge_s[np.ix_(group_a, group_b)])

    def combine(self, group_times_s: np.ndarray, link_times_s: np.ndarray) -> tuple[CostBreakdown, list[int]]:
        pipe_s, order = shortest_path(link_times_s)
        return CostBreakdown(data_parallel_s=float(group_times_s.max()), pipeline_parallel_s=2 * pipe_s), order

    def lower_bound_s(self, group_times_s: np.ndarray, link_times_s: np.ndarray) -> float:
        """DataP + 2·MST: a Hamiltonian path is a spanning tree, so no path is lighter than the minimum one."""
        return float(group_times_s.max()) + 2 * spanning_tree_weight(link_times_s)

    def evaluate(self, partition: np.ndarray) -> tuple[CostBreakdown, list[int]]:
        """Cost and best stage order of a (d_pp, d_dp) partition, computed from scratch (no caches)."""
        partition = self.checked_partition(partition)
        links = np.zeros((self.d_pp, self.d_pp))
        for j in range(self.d_pp):
            for k in range(j + 1, self.d_pp):
                links[j, k] = links[k, j] = self.link_terms_s(partition[j], partition[k])[0]
        return self.combine(self.group_times_s(partition), links)

    def checked_partition(self, partition: np.ndarray) -> np.ndarray:
        """The partition as a (d_pp, d_dp) int array, after checking it uses every device exactly once."""
        partition = np.asarray(partition, dtype=np.int64)
        if partition.shape != (self.d_pp, self.d_dp):
            raise InvalidPlanShape(
                f"a partition here is {self.d_pp} groups × {self.d_dp} devices, got shape {partition.shape}"
            )
        if not np.array_equal(np.sort(partition.ravel()), np.arange(self.n_devices)):
            raise InvalidPlanShape(f"a partition must use each of the {self.n_devices} devices exactly once")
        return partition


def spanning_tree_weight(weights: np.ndarray) -> float:
    """Weight of a minimum spanning tree of a complete graph (Prim, one numpy step per node): a bound below the
    weight of any Hamiltonian path."""
    n = len(weights)
    in_tree = np.zeros(n, dtype=bool)
    in_tree[0] = True
    distance = weights[0].copy()
    total = 0.0
    for _ in range(n - 1):
        candidates = np.where(in_tree, np.inf, distance)
        nearest = int(np.argmin(candidates))
        total += candidates[nearest]
        in_tree[nearest] = True
        distance = np.minimum(distance, weights[nearest])
    return float(total)
