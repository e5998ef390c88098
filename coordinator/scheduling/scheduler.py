"""The scheduler's front door: a network and payloads in, a deployable plan out.

It prices the network with the paper's cost model (or the live one, when it knows the devices' hardware), seeds the
search with plans that keep close devices together (and, on mixed hardware, devices of one speed), runs the search
within its budget, and deploys the best partition along its bottleneck matchings.
"""
from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from operator import itemgetter

import numpy as np

from hetswarm.coordinator.scheduling.baselines import greedy_placement
from hetswarm.coordinator.scheduling.cost_model import InvalidPlanShape, PaperCostModel, Payloads
from hetswarm.coordinator.scheduling.live_cost import Execution, NoFeasiblePlan
from hetswarm.coordinator.scheduling.live_objective import Hardware, LiveCostModel, execution_options
from hetswarm.coordinator.scheduling.neighbourhood import CachedEvaluator, Candidate
from hetswarm.coordinator.scheduling.plan import Plan, plan_from_partition
from hetswarm.coordinator.scheduling.search import SearchConfig, SearchProgress, SearchResult, search
from hetswarm.protocol.network import Network
from hetswarm.protocol.units import BYTES_PER_GB

__all__ = ["PAPER_DEVICES", "SPEED_GAP", "ScheduleResult", "ShapedResult", "candidate_shapes", "find_plan",
           "find_shaped_plan", "plan_degrees", "seed_partitions", "shapes_in_time", "speed_tiers"]

SPEED_GAP = 2.0
"""Devices this many times slower than the rest may be left standing by (`speed_tiers`)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ScheduleResult:
    plan: Plan
    search: SearchResult
    execution: Execution | None = None
    """With the live objective: the plan's cut, schedule, micro-batches and recomputation (live_cost.Execution)."""


def find_plan(
    network: Network,
    payloads: Payloads,
    *,
    d_dp: int,
    d_pp: int,
    config: SearchConfig = SearchConfig(),
    progress: Callable[[SearchProgress], None] | None = None,
    hardware: Hardware | None = None,
    balanced: bool = True,
) -> ScheduleResult:
    """Searches for the cheapest plan of D_DP × D_PP tasklets on `network`: under the paper's cost model, or, given
    the devices' `hardware`, under the live one (coordinator/scheduling/live_objective.py), with the layers cut for the
    placement (`balanced`) or evenly, and the stages run a way that fits the devices' memory
    (`execution_options`): the search runs under the way its seeds choose (`_best_seeded`), or, when no seed
    fits any way, under each way in turn until one fits (skipping those that need no less memory anywhere than one
    that did not); then the plan found runs the way chosen for it (`_way_for_found`): the least change from the
    model's own that fits, unless another is clearly faster (`WAY_MARGIN`). The plan's `breakdown` is its paper cost,
    with each stage's own payload; `predict_step_s` with the result's execution prices it live.

    Raises:
        InvalidPlanShape: D_DP · D_PP is not the number of devices.
        NoFeasiblePlan: a device of `hardware` has no TFLOPS.
    """
    started = time.monotonic()
    model = PaperCostModel(network, payloads, d_dp=d_dp, d_pp=d_pp)
    seeds = seed_partitions(model)
    if hardware is None:
        result = search(model, config, classes=network.twin_classes, seeds=seeds, progress=progress)
        return ScheduleResult(plan=plan_from_partition(model, result.best.partition, result.best.order),
                              search=result)
    seeds.append(greedy_placement(model, hardware.tflops).grid)  # groups of equal speed
    options = [LiveCostModel(model, hardware, option=option, balanced=balanced)
               for option in execution_options(hardware.model, d_dp)]
    choosing = time.monotonic()
    if (live := _best_seeded(options, seeds)) is not None:
        # The whole plan is made within the budget: what was spent so far, and pricing the partition found every way
        # after the search (`_way_for_found`: about as long as one seed took; twice that, for its spread and the
        # search's last move), are taken from the search's share.
        seeded = time.monotonic()
        left = config.time_budget_s - (seeded - started) - 2 * (seeded - choosing) / len(seeds)
        config = replace(config, time_budget_s=max(left, config.time_budget_s / 10))
        result = search(live, config, classes=live.classes, seeds=seeds, progress=progress)
    else:
        too_big: list[np.ndarray] = []  # what the options that did not fit need
        for live in options:
            if any((live.need_gib >= need).all() for need in too_big):
                continue  # needs at least as much everywhere (1F1B with M ≤ D_PP holds all M, as GPipe does)
            result = search(live, config, classes=live.classes, seeds=seeds, progress=progress)
            if result.best.breakdown.short_gib == 0:
                break
            too_big.append(live.need_gib)
    live, best = _way_for_found(options, live, result.best)
    result = replace(result, best=best)
    execution = live.execution(result.best.breakdown)
    stage_dp_bytes = live.dp_gb[np.arange(d_pp), list(execution.layer_counts)] * BYTES_PER_GB
    plan = plan_from_partition(model, result.best.partition, result.best.order, stage_dp_bytes=stage_dp_bytes,
                               matched_by=live.hops)
    return ScheduleResult(plan=plan, search=result, execution=execution)


WAY_MARGIN = 0.05
"""How much faster than the first way that fits (`execution_options`, least change first) a later way must be
predicted to be chosen: near-ties keep the model's own way, since the live model prices no fixed cost per pass
(which would favour fewer micro-batches a little) and another micro-batch count or schedule sums the gradients in
another order. A clear gain is taken: at 1,024 devices the plan runs 1F1B with 7 micro-batches at 6.97 s/step
(benchmarks/RESULTS.md, live-scale), where a 15 % margin kept a way that gave 7.83."""


def _best_seeded(options: list[LiveCostModel], seeds: list[np.ndarray]) -> LiveCostModel | None:
    """The way to run the stages that the best seeds choose: the search starts from the seeds and mostly refines
    them, so that way is where it should look. None when no seed fits any way."""
    chosen = _chosen_way(options, seeds)
    return None if chosen is None else chosen[0]


def _way_for_found(options: list[LiveCostModel], live: LiveCostModel, found: Candidate
                   ) -> tuple[LiveCostModel, Candidate]:
    """The partition `live`'s search found, run the way it is chosen for (each option re-cuts and re-orders it):
    the search ran under one way, and another may suit what it found better (fewer bubbles with more
    micro-batches, which cost a latency per hop each: live_cost's Φ)."""
    return _chosen_way(options, [found.partition]) or (live, found)


def _chosen_way(options: list[LiveCostModel], partitions: list[np.ndarray]
                ) -> tuple[LiveCostModel, Candidate] | None:
    """The first way (in `options`' order) in which some partition fits, with its fastest such partition, unless a
    later way's is faster by `WAY_MARGIN`; None when none fits any way."""
    chosen = None
    for live in options:
        cached = CachedEvaluator(live)
        fits = [candidate for candidate in map(cached.candidate, partitions) if candidate.breakdown.short_gib == 0]
        if not fits:
            continue
        fastest = min(fits, key=lambda candidate: candidate.cost_s)
        if chosen is None or fastest.cost_s < chosen[1].cost_s * (1 - WAY_MARGIN):
            chosen = (live, fastest)
    return chosen


@dataclass(frozen=True, kw_only=True, slots=True)
class ShapedResult:
    """The best of several shapes: its plan is over `placed` (device i of the plan is device placed[i])."""

    result: ScheduleResult
    placed: list[int]
    predicted_step_s: float
    shapes: dict[tuple[int, int], float | None]
    """(D_DP, D_PP) tried → predicted step seconds; None where no placement fits."""
    untried_stages: list[int]
    """Stage counts the time budget left no time to try."""


def find_shaped_plan(network: Network, hardware: Hardware, *, d_pp: int | None, d_dp: int | None = None,
                     config: SearchConfig = SearchConfig()) -> ShapedResult:
    """Also chooses the shape, leaving much slower devices as standbys: a synchronous stage group runs at its
    slowest member, so on mixed GPUs fewer, faster pipelines can win, and fewer stages carry fewer activations
    over slow links (each stage then holds more of the model). Tries every stage count up to the model's layers
    (`d_pp` None) or `d_pp`; with each, `d_dp` pipelines, or as many as all the devices fill and as many as each
    faster tier of them fills (`speed_tiers`), as the coordinator's planner does; each shape on the fastest devices
    (more memory first among equals), with an equal share of the time budget, fewest stages first
    (`shapes_in_time`).

    Raises:
        NoFeasiblePlan: no shape has a placement whose stages fit.
    """
    candidates = candidate_shapes(speed_tiers(hardware.tflops), hardware.model.n_layers, d_dp=d_dp, d_pp=d_pp)
    budget = replace(config, time_budget_s=config.time_budget_s / max(len(candidates), 1))
    order = sorted(range(network.n_devices), key=lambda d: (-hardware.tflops[d], -hardware.memory_gib[d], d))
    best: tuple[float, ScheduleResult, list[int]] | None = None
    tried: dict[tuple[int, int], float | None] = {}
    untried: list[int] = []
    for count, stages in shapes_in_time(candidates, config.time_budget_s, lambda: best is not None, untried):
        placed = sorted(order[:count * stages])
        sub = replace(hardware, tflops=hardware.tflops[placed], memory_gib=hardware.memory_gib[placed])
        payloads = Payloads.from_model(hardware.model, d_dp=count, d_pp=stages)
        result = find_plan(network.subset(placed), payloads, d_dp=count, d_pp=stages, config=budget, hardware=sub)
        cost = result.search.best.breakdown
        tried[(count, stages)] = None if cost.short_gib > 0 else cost.total_s
        if cost.short_gib == 0 and (best is None or cost.total_s < best[0]):
            best = (cost.total_s, result, placed)
    if best is None:
        shapes_tried = ", ".join(f"{count}×{stages}" for count, stages in tried) or "none"
        raise NoFeasiblePlan(f"no placement fits the devices' memory in any shape tried ({shapes_tried})")
    step_s, result, placed = best
    return ShapedResult(result=result, placed=placed, predicted_step_s=step_s, shapes=tried, untried_stages=untried)


def speed_tiers(tflops: np.ndarray) -> list[int]:
    """How many devices to plan with: all of them, then as many as are at least SPEED_GAP× faster than every device
    left out, most first. Devices stand by for being much slower, never to shrink a swarm of like devices: there
    compute is small beside the all-reduce, and the live model, which prices no fixed cost per pass, would favour
    fewer pipelines than real hardware rewards."""
    ordered = np.sort(np.asarray(tflops, dtype=float))[::-1]
    gaps = [k for k in range(len(ordered) - 1, 0, -1) if ordered[k - 1] >= SPEED_GAP * ordered[k]]
    return [len(ordered), *gaps]


def candidate_shapes(device_counts: list[int], n_layers: int, *, d_dp: int | None, d_pp: int | None
                     ) -> list[tuple[int, int]]:
    """(D_DP, D_PP) to try, fewest stages first: `d_pp` stages, or every count up to the model's layers; with each,
    `d_dp` pipelines where they fit, or as many as each of `device_counts` (most first) fills."""
    stage_counts = [d_pp] if d_pp is not None else range(1, min(n_layers, max(device_counts)) + 1)
    shapes = []
    for stages in stage_counts:
        for devices in device_counts:
            count = d_dp if d_dp is not None else devices // stages
            if 1 <= count * stages <= devices and (count, stages) not in shapes:
                shapes.append((count, stages))
    return shapes


def shapes_in_time(shapes: list[tuple[int, int]], budget_s: float, found: Callable[[], bool],
                   untried: list[int]) -> Iterator[tuple[int, int]]:
    """`shapes` (fewest stages first) until `budget_s` is spent and `found()` says a plan fits; the stage counts
    left are appended to `untried`. A deep pipeline's seeds alone take a second or more to order (tsp.py), and on
    the heterogeneous scenarios the best shapes have few stages (benchmarks/RESULTS.md)."""
    deadline = time.monotonic() + budget_s
    for stages, shapes_of_stages in itertools.groupby(shapes, key=itemgetter(1)):
        if found() and time.monotonic() > deadline:
            untried.append(stages)
            continue
        yield from shapes_of_stages


def seed_partitions(model: PaperCostModel) -> list[np.ndarray]:
    """Structured starting points: pipelines packed inside sites; and, for orders that keep close devices
    adjacent, groups as consecutive blocks (each stage inside one place, pipelines across) and as strides (each
    pipeline inside one place, stages across). On the paper's networks the paper's search converges to the
    pipelines-inside-sites shape."""
    shape = (model.d_pp, model.d_dp)
    seeds = [_packed_pipelines(model.network, d_dp=model.d_dp, d_pp=model.d_pp)]
    for order in (_site_order(model.network), _nearest_neighbour_order(model.pp_edge_s)):
        seeds.append(order.reshape(shape))
        seeds.append(order.reshape(model.d_dp, model.d_pp).T.copy())
    return seeds


def _packed_pipelines(network: Network, *, d_dp: int, d_pp: int) -> np.ndarray:
    """Each site's devices as consecutive stages of as few pipelines as possible (smallest sites first, each into
    the pipeline with the most room), so that most pipeline hops stay inside a site and stage s of different
    pipelines holds the s-th device of different sites."""
    by_site: dict[str, list[int]] = {}
    for device, site in enumerate(network.sites):
        by_site.setdefault(site, []).append(device)
    columns: list[list[int]] = [[] for _ in range(d_dp)]
    for devices in sorted(by_site.values(), key=len):
        while devices:
            pipeline = max(range(d_dp), key=lambda r: d_pp - len(columns[r]))
            room = d_pp - len(columns[pipeline])
            columns[pipeline] += devices[:room]
            devices = devices[room:]
    return np.array(columns).T.copy()  # (d_pp, d_dp): row s is stage group s


def _site_order(network: Network) -> np.ndarray:
    """Devices grouped by site, sites in order of first appearance."""
    first_seen = {site: index for index, site in reversed(list(enumerate(network.sites)))}
    return np.array(sorted(range(network.n_devices), key=lambda d: (first_seen[network.sites[d]], d)))


def _nearest_neighbour_order(edge_s: np.ndarray) -> np.ndarray:
    """A greedy chain from device 0 to the nearest unvisited device each time: close devices end up adjacent."""
    n = len(edge_s)
    order, unvisited = [0], np.ones(n, dtype=bool)
    unvisited[0] = False
    for _ in range(n - 1):
        order.append(int(np.argmin(np.where(unvisited, edge_s[order[-1]], np.inf))))
        unvisited[order[-1]] = False
    return np.array(order)


PAPER_DEVICES = 64
"""The paper's device count (docs/dtfm.md), planned 8 × 8 as the paper does."""


def plan_degrees(n_devices: int, dp: int | None, pp: int | None) -> tuple[int, int]:
    """(D_DP, D_PP) for a plan of all `n_devices`, either given or chosen: the paper's 8 × 8 for its 64 devices,
    else the most stages up to the square root that divide the devices.

    Raises:
        InvalidPlanShape: the degrees do not multiply to the device count.
    """
    if dp is None and pp is None:
        if n_devices == PAPER_DEVICES:
            return 8, 8
        pp = max(d for d in range(1, math.isqrt(n_devices) + 1) if n_devices % d == 0)
    given = dp if dp is not None else pp
    if given is not None and (given < 1 or n_devices % given):
        raise InvalidPlanShape(f"{given} does not divide the {n_devices} devices; --dp × --pp must equal their count")
    dp = n_devices // pp if dp is None else dp
    pp = n_devices // dp if pp is None else pp
    if dp * pp != n_devices:
        raise InvalidPlanShape(f"--dp × --pp = {dp} × {pp} = {dp * pp}, but the network has {n_devices} devices")
    return dp, pp
