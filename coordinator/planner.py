"""Turning the swarm view into plans, and deciding when a new plan is worth a new assignment version.

A proposal places D_DP × D_PP of the trainable peers (the rest stay standbys) with the scheduler, or with a
baseline placement when the operator asks for one to compare, and prices the result with the live cost model.
Degrees left to `auto` are chosen among the shapes the peers' memory allows (D_PP up to the model's layer count,
fewest stages first until the time budget is spent; D_DP as many pipelines as the peers fill, or as the peers of
each faster tier fill, the much slower ones standing by: scheduler.speed_tiers), by the live model's predicted step
time. So is the wire under the `auto` compression policy (protocol/wire_format.py): the search places peers for the
lightest wire; on that placement the plan takes the least lossy uniform wire predicted within AUTO_TOLERANCE of the
fastest, then gives each hop and stage group the least lossy codec that keeps the step there
(coordinator/scheduling/wire_choice.py).

The replanner (coordinator/replanner.py) decides when a proposal becomes a published plan.
"""
from __future__ import annotations

import logging
from collections.abc import Collection
from dataclasses import dataclass, replace
from typing import Any, Literal

import numpy as np

from hetswarm.coordinator.scheduling.baselines import default_placement, random_placement
from hetswarm.coordinator.scheduling.cost_model import PaperCostModel, Payloads
from hetswarm.coordinator.scheduling.live_cost import (
    Execution,
    LiveBreakdown,
    NoFeasiblePlan,
    StageCosts,
)
from hetswarm.coordinator.scheduling.live_objective import Hardware, execution_options, fitting
from hetswarm.coordinator.scheduling.plan import Plan
from hetswarm.coordinator.scheduling.scheduler import candidate_shapes, find_plan, shapes_in_time, speed_tiers
from hetswarm.coordinator.scheduling.search import SearchConfig
from hetswarm.coordinator.scheduling.wire_choice import choose_wire
from hetswarm.coordinator.swarm_view import SwarmView
from hetswarm.protocol.errors import ConfigError
from hetswarm.protocol.keys import short_ids
from hetswarm.protocol.model_config import ModelConfig
from hetswarm.protocol.units import BYTES_PER_GIB
from hetswarm.protocol.wire_format import (
    COMPRESSION_POLICIES,
    DELTA_POLICIES,
    CompressionPolicy,
    WireFormat,
    candidate_wires,
)

__all__ = ["PLACEMENTS", "Placement", "PlannerConfig", "Proposal", "deployed", "propose", "reprice"]

logger = logging.getLogger(__name__)

Placement = Literal["scheduled", "paper", "random", "default"]
PLACEMENTS: tuple[Placement, ...] = ("scheduled", "paper", "random", "default")


@dataclass(frozen=True, kw_only=True, slots=True)
class PlannerConfig:
    model: ModelConfig
    d_dp: int | None = None
    """Pipelines; None chooses it (module docstring)."""
    d_pp: int | None = None
    """Stages; None chooses it."""
    placement: Placement = "scheduled"
    """`paper` (the search on DT-FM's communication cost, the even cut), `random` (one seeded random grid) and
    `default` (peer-id order) broadcast a baseline instead of the live search's plan, so that measured step times
    can be compared."""
    compression: CompressionPolicy = "model"
    """Which codecs the plan's transfers use (protocol/wire_format.py)."""
    search: SearchConfig = SearchConfig()
    min_peers: int = 1
    """The first plan waits for this many trainable peers; later ones follow membership while a plan fits."""
    min_trusted: int = 2
    """No plan puts the whole model on fewer peers than this unless their claims are confirmed (`propose`); a swarm
    of fewer peers is planned as it is."""
    debounce_s: float = 5.0
    """Membership must stay unchanged this long before a new version is published."""
    measure_wait_s: float = 60.0
    """After a membership change, wait up to this long for the peers' links to be measured: every pair in a swarm of
    up to k+1 peers, the first round of sparse measurement in a larger one (protocol/measurement_policy.py)."""
    improvement: float = 0.1
    """On unchanged membership, a new plan must be predicted this fraction faster than the current one."""
    reconsider_s: float = 30.0
    """How often fresh measurements are checked for a clearly better plan."""
    suspect_s: float = 60.0
    """A peer that a member of the plan reported unreachable is left out of plans this long (then it may be
    planned in again, as any joiner, if its record is still there)."""
    payback_steps: int = 200
    """A re-plan that moves peers off their stages must win back their state hand-off within this many steps
    (coordinator/sticky.py)."""
    retry_s: float = 30.0
    """At most this often, a plan whose members report they are stalled is republished as is (a new version from
    the last committed step), which restarts their workers."""

    def __post_init__(self) -> None:
        for name in ("d_dp", "d_pp"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ConfigError(f"{name} must be positive or auto, got {getattr(self, name)}")
        if self.d_pp is not None and self.d_pp > self.model.n_layers:
            raise ConfigError(f"d_pp={self.d_pp} exceeds the {self.model.n_layers} layers of {self.model.name!r}")
        if self.placement not in PLACEMENTS:
            raise ConfigError(f"placement must be one of {', '.join(PLACEMENTS)}, got {self.placement!r}")
        if self.compression not in COMPRESSION_POLICIES:
            raise ConfigError(f"compression must be one of {', '.join(COMPRESSION_POLICIES)}, got {self.compression!r}")
        if self.compression in DELTA_POLICIES and (self.model.data_period or 0) < 2:
            raise ConfigError(f"compression {self.compression} sends activation deltas of samples that recur: give the "
                              f"model a data_period of at least 2 steps (--data-period), got {self.model.data_period}")
        if (self.min_peers < 1 or self.min_trusted < 1 or self.payback_steps < 0 or self.debounce_s < 0
                or self.measure_wait_s < 0 or self.reconsider_s <= 0 or not 0 <= self.improvement < 1):
            raise ConfigError(f"bad replanning settings: min_peers={self.min_peers}, min_trusted={self.min_trusted}, "
                              f"debounce_s={self.debounce_s}, measure_wait_s={self.measure_wait_s}, "
                              f"reconsider_s={self.reconsider_s}, improvement={self.improvement} (want [0, 1))")


@dataclass(frozen=True, kw_only=True, slots=True)
class Proposal:
    """A priced plan over some peers of the swarm; device i of the plan is `view.peer_ids[i]`."""

    view: SwarmView
    """The placed peers and the matrices the plan was made on."""
    plan: Plan
    live: LiveBreakdown
    model: ModelConfig
    wire: WireFormat
    execution: Execution
    """The plan's cut of the layers, micro-batches and recomputation (coordinator/scheduling/live_cost.py)."""
    standbys: tuple[str, ...] = ()

    @property
    def peers(self) -> frozenset[str]:
        """Every peer the proposal speaks for, placed or standby."""
        return frozenset(self.view.peer_ids) | frozenset(self.standbys)

    @property
    def pipelines(self) -> list[list[str]]:
        """Pipeline r: the peer id of each stage, in stage order."""
        return [[self.view.peer_ids[d] for d in column] for column in self.plan.pipelines]

    def estimated_links(self) -> list[tuple[str, str]]:
        """The links the plan sends over that nobody measured (SwarmView.estimated_among)."""
        return self.view.estimated_among(self.plan.pipelines)

    def to_dict(self) -> dict[str, Any]:
        """Plan.to_dict() plus the peers, the matrices it was made on, and the live prediction (JSON-ready)."""
        return self.plan.to_dict() | self.view.to_dict() | {
            "model": self.model.to_dict(),
            "peers": list(self.view.peer_ids),
            "standbys": list(self.standbys),
            "predicted_step_s": self.live.total_s,
            "breakdown": self.live.to_dict(),
            "wire": self.wire.to_dict(),
            "execution": {"stage_layers": self.execution.stage_layers, "micro_batches": self.execution.micro_batches,
                          "recompute": self.execution.recompute, "schedule": self.execution.schedule},
        }


def propose(view: SwarmView, config: PlannerConfig, *, prefer: frozenset[str] = frozenset(),
            trusted: Collection[str] | None = None) -> Proposal:
    """The best proposal over the shapes allowed; peers in `prefer` (the current plan's) are placed first. A shape
    of fewer than `config.min_trusted` peers places only `trusted` ones (whose claims their reports confirmed,
    coordinator/claims.py; None trusts every peer): one peer's word must not get it the whole model.

    Raises:
        NoFeasiblePlan: no shape fits the peers' number and memory.
    """
    shapes = candidate_shapes(speed_tiers(view.tflops), config.model.n_layers, d_dp=config.d_dp, d_pp=config.d_pp)
    budget = config.search.time_budget_s / max(len(shapes), 1)
    best, refusals, untried = None, [], []
    for d_dp, d_pp in shapes_in_time(shapes, config.search.time_budget_s, lambda: best is not None, untried):
        need_gib = _least_memory_gib(config.model, d_dp=d_dp, d_pp=d_pp)
        fits = [p for p, memory in zip(view.peer_ids, view.memory_gib) if memory >= need_gib]
        if trusted is not None and d_dp * d_pp < min(config.min_trusted, view.n_peers):
            if len(fits := [p for p in fits if p in trusted]) < d_dp * d_pp:
                refusals.append(f"{d_dp}×{d_pp} would put the model on fewer than {config.min_trusted} peers "
                                f"whose claims are unconfirmed")
                continue
        if len(fits) < d_dp * d_pp:
            refusals.append(f"{d_dp}×{d_pp} needs {d_dp * d_pp} peers with {need_gib:.2f} GiB, {len(fits)} have it")
            continue
        tflops = dict(zip(view.peer_ids, view.tflops))
        chosen = sorted(fits, key=lambda p: (p not in prefer, -tflops[p], p))[: d_dp * d_pp]
        placed = view.subset(sorted(chosen))
        search = replace(config.search, time_budget_s=budget)
        wires = candidate_wires(config.compression, config.model)
        try:
            grid, execution = _place(placed, config.model, config.placement, d_dp=d_dp, d_pp=d_pp, search=search,
                                     wire=wires[-1])
            proposal = _priced(placed, grid, config.model, wires, execution)
        except NoFeasiblePlan as e:
            refusals.append(f"{d_dp}×{d_pp}: {e}")
            continue
        logger.debug(f"shape {d_dp}×{d_pp}: predicted {proposal.live.total_s:.3f} s with {proposal.wire.describe()}")
        if best is None or proposal.live.total_s < best.live.total_s:
            best = replace(proposal, standbys=tuple(p for p in view.peer_ids if p not in chosen))
    if untried:
        logger.info(f"The time budget left no time for {len(untried)} stage counts from {untried[0]}")
    if not shapes:
        refusals.append(f"D_DP={config.d_dp or 'auto'} × D_PP={config.d_pp or 'auto'} needs more peers")
    if best is None:
        raise NoFeasiblePlan(f"no plan fits {view.n_peers} peers: " + "; ".join(refusals))
    return best


def _priced(placed: SwarmView, grid: np.ndarray, model: ModelConfig, wires: list[WireFormat], execution: Execution
            ) -> Proposal:
    """The proposal that deploys `grid` on the peers of `placed`, run as `execution`, with the wire chosen among
    `wires` (one: that wire; coordinator/scheduling/wire_choice.py)."""
    hardware = Hardware(model=model, tflops=placed.tflops, memory_gib=placed.memory_gib)
    priced = choose_wire(placed.network, hardware, grid, wires, execution)
    return Proposal(view=placed, plan=priced.plan, live=priced.live, model=model, wire=priced.wire,
                    execution=execution)


def reprice(proposal: Proposal, view: SwarmView) -> Proposal:
    """The same deployment priced on a fresher view of the same peers."""
    repriced = _priced(view.subset(list(proposal.view.peer_ids)), proposal.plan.grid, proposal.model,
                       [proposal.wire], proposal.execution)
    return replace(repriced, standbys=proposal.standbys)


def deployed(view: SwarmView, pipelines: list[list[str]], model: ModelConfig, wires: list[WireFormat],
             execution: Execution | None = None) -> Proposal:
    """The proposal that deploys given pipelines (pipeline r: the peer of each stage) as they are, priced on `view`;
    the view's other peers are its standbys. How a coordinator takes over a plan it did not search for now.

    Args:
        wires: one, the plan's; or a policy's candidates (`candidate_wires`), to choose among for these links.
        execution: how the stages run; None: the model's even cut, run the first way that fits (`fitting`).

    Raises:
        ValueError: a peer of the pipelines is not in the view.
        NoFeasiblePlan: a stage does not fit its peer's memory in any way.
    """
    placed_ids = sorted({peer for chain in pipelines for peer in chain})
    missing = [p for p in placed_ids if p not in view.peer_ids]
    if missing:
        raise ValueError(f"{len(missing)} peer(s) of the pipelines are not in the view: {short_ids(frozenset(missing))}")
    placed = view.subset(placed_ids)
    index = {peer: i for i, peer in enumerate(placed_ids)}
    grid = np.array([[index[peer] for peer in chain] for chain in pipelines], dtype=np.int64).T  # (d_pp, d_dp)
    execution = execution or fitting(model, placed.memory_gib[grid])
    return replace(_priced(placed, grid, model, wires, execution),
                   standbys=tuple(p for p in view.peer_ids if p not in index))


def _least_memory_gib(model: ModelConfig, *, d_dp: int, d_pp: int) -> float:
    """The least memory a peer needs to be placed at all: one layer of the lightest stage position, run the most
    frugal way (`execution_options`' last)."""
    costs = StageCosts(model, d_pp=d_pp, d_dp=d_dp, **execution_options(model, d_dp)[-1]._asdict())
    return float(costs.memory_bytes[:, 1].min()) / BYTES_PER_GIB if d_pp > 1 else \
        float(costs.memory_bytes[0, model.n_layers]) / BYTES_PER_GIB


def _place(view: SwarmView, model: ModelConfig, placement: Placement, *, d_dp: int, d_pp: int,
           search: SearchConfig, wire: WireFormat) -> tuple[np.ndarray, Execution]:
    """The grid and how it runs: the live objective's (coordinator/scheduling/live_objective.py), or a baseline's (the paper
    objective's included) with the model's even cut, run the first way that fits.

    Raises:
        NoFeasiblePlan: the search found no placement whose stages fit their peers.
    """
    payloads = Payloads.from_model(model, d_dp=d_dp, d_pp=d_pp, wire=wire)
    if placement == "scheduled":
        hardware = Hardware(model=model, tflops=view.tflops, memory_gib=view.memory_gib)
        result = find_plan(view.network, payloads, d_dp=d_dp, d_pp=d_pp, config=search, hardware=hardware)
        if result.search.best.breakdown.short_gib > 0:
            raise NoFeasiblePlan(f"no placement fits the peers' memory (the best lacks "
                                 f"{result.search.best.breakdown.short_gib:.2f} GiB)")
        return result.plan.grid, result.execution
    paper = PaperCostModel(view.network, payloads, d_dp=d_dp, d_pp=d_pp)
    if placement == "paper":
        grid = find_plan(view.network, payloads, d_dp=d_dp, d_pp=d_pp, config=search).plan.grid
    elif placement == "random":
        grid = random_placement(paper, samples=1, seed=search.seed).grid
    else:
        grid = default_placement(paper).grid
    return grid, fitting(model, view.memory_gib[grid])
