"""The live cost model as the search's objective (coordinator/scheduling/live_objective.py), checked against brute force: on
small random swarms of mixed speed and memory, the search finds the partition, stage order and cut of the layers
that the live model itself (`predict_step_s` of the deployed plan, as the search sees it: `as_searched`)
prices lowest among all of them, in the way of running the stages the scheduler chooses (the first that fits, unless
a later one is clearly faster), and its cost is that price."""
from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest

from hetswarm.coordinator.scheduling.baselines import greedy_placement
from hetswarm.coordinator.scheduling.cost_model import PaperCostModel, Payloads
from hetswarm.coordinator.scheduling.live_cost import (
    Execution,
    ExecutionOption,
    LiveBreakdown,
    NoFeasiblePlan,
    predict_step_s,
    stage_memory_bytes,
)
from hetswarm.coordinator.scheduling.live_objective import PENALTY_S_PER_GIB, Hardware, LiveCostModel, execution_options
from hetswarm.coordinator.scheduling.neighbourhood import CachedEvaluator
from hetswarm.coordinator.scheduling.plan import plan_from_partition
from hetswarm.coordinator.scheduling.scheduler import WAY_MARGIN, find_plan, find_shaped_plan
from hetswarm.coordinator.scheduling.search import SearchConfig
from hetswarm.protocol.model_config import get_model_config
from hetswarm.protocol.network import Network
from hetswarm.protocol.units import BYTES_PER_GB, BYTES_PER_GIB
from tests.helpers.scheduler_oracles import balanced_partitions

MODEL = replace(get_model_config("small"), batch_tokens=64 * 256)


def swarm(seed: int, d_dp: int, d_pp: int, *, small_share: float = 0.3) -> tuple[Network, np.ndarray, np.ndarray]:
    """Random links (1–200 ms, 0.05–5 Gbit/s), TFLOPS of two speeds 4× apart, and memory that holds any stage or,
    on a `small_share` of the devices, only the lighter ones (not the first and last, which hold the embedding and
    the head)."""
    n = d_dp * d_pp
    rng = np.random.default_rng(seed)
    latency = rng.uniform(1, 200, (n, n))
    bandwidth = rng.uniform(0.05, 5, (n, n))
    latency, bandwidth = (latency + latency.T) / 2, (bandwidth + bandwidth.T) / 2
    np.fill_diagonal(latency, 0.0)
    np.fill_diagonal(bandwidth, 100.0)
    tflops = rng.choice([0.002, 0.008], n)
    need_gib = np.asarray(stage_memory_bytes(MODEL, d_pp=d_pp, d_dp=d_dp)) / BYTES_PER_GIB
    memory = np.where(rng.random(n) < small_share, (need_gib.min() + need_gib.max()) / 2, 2 * need_gib.max())
    return Network.from_matrices(latency, bandwidth, name=f"random-{seed}"), tflops, memory


def compositions(total: int, parts: int):
    """Every cut of `total` layers into `parts` stages of at least one."""
    for bounds in itertools.combinations(range(1, total), parts - 1):
        edges = (0, *bounds, total)
        yield tuple(b - a for a, b in zip(edges, edges[1:]))


def slowest_of_group(tflops: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """Every device as fast as the slowest of its stage group."""
    slowest = tflops.copy()
    for group in grid:
        slowest[group] = tflops[group].min()
    return slowest


def as_searched(plan, tflops: np.ndarray, memory: np.ndarray, latency_ms: np.ndarray,
                execution: Execution) -> LiveBreakdown:
    """The live model's price of a plan as the search sees it: every device as slow as its stage group's slowest,
    every hop as its stage boundary's slowest (coordinator/scheduling/live_objective.py)."""
    return predict_step_s(plan, MODEL, tflops=slowest_of_group(tflops, plan.grid), memory_gib=memory,
                          latency_ms=latency_ms, execution=execution, slowest_hops=True)


def searched_and_deployed(plan, tflops: np.ndarray, memory: np.ndarray, latency_ms: np.ndarray,
                          execution: Execution) -> tuple[LiveBreakdown, LiveBreakdown]:
    """`as_searched`, which bounds the plan's price as deployed from above, and that price."""
    return (as_searched(plan, tflops, memory, latency_ms, execution),
            predict_step_s(plan, MODEL, tflops=tflops, memory_gib=memory, latency_ms=latency_ms, execution=execution))


def brute_force(paper: PaperCostModel, tflops: np.ndarray, memory: np.ndarray, *, balanced: bool
                ) -> tuple[float, Execution | None]:
    """The lowest live step time over every partition, stage order and (with `balanced`) cut, as the search sees
    it, in the way the scheduler would run it: the first of `execution_options` in which anything fits, unless a
    later way's optimum is lower by `WAY_MARGIN`; (inf, None) when nothing fits."""
    best, best_execution = np.inf, None
    for option in execution_options(MODEL, paper.d_dp):
        step_s, execution = _brute_force_in(paper, tflops, memory, option, balanced=balanced)
        if best == np.inf or step_s < best * (1 - WAY_MARGIN):
            best, best_execution = step_s, execution
    return best, best_execution


def _brute_force_in(paper: PaperCostModel, tflops: np.ndarray, memory: np.ndarray, option: ExecutionOption, *,
                    balanced: bool) -> tuple[float, Execution | None]:
    """The lowest live step time run the way `option`; (inf, None) when nothing fits that way."""
    best, best_execution = np.inf, None
    even = Execution.even(MODEL, paper.d_pp, **option._asdict())
    cuts = compositions(MODEL.n_layers, paper.d_pp) if balanced else [even.layer_counts]
    hops = paper.with_pp_bytes(paper.payloads.pp_bytes / even.micro_batches)  # one micro-batch per hop
    for execution in (replace(even, layer_counts=cut) for cut in cuts):
        stage_dp_bytes = [MODEL.dp_payload_bytes_of(count, first=s == 0, last=s == paper.d_pp - 1)
                          for s, count in enumerate(execution.layer_counts)]
        for groups in balanced_partitions(tuple(range(paper.n_devices)), paper.d_dp):
            for order in itertools.permutations(range(paper.d_pp)):
                plan = plan_from_partition(paper, np.array(groups), list(order), np.array(stage_dp_bytes),
                                           matched_by=hops)
                try:
                    step_s = as_searched(plan, tflops, memory, paper.network.latency_ms, execution).total_s
                except NoFeasiblePlan:
                    continue
                if step_s < best:
                    best, best_execution = step_s, execution
    return best, best_execution


def live_plan(network: Network, tflops: np.ndarray, memory: np.ndarray, *, d_dp: int, d_pp: int, balanced: bool,
              seed: int = 0):
    payloads = Payloads.from_model(MODEL, d_dp=d_dp, d_pp=d_pp)
    hardware = Hardware(model=MODEL, tflops=tflops, memory_gib=memory)
    return find_plan(network, payloads, d_dp=d_dp, d_pp=d_pp, config=SearchConfig(seed=seed), hardware=hardware,
                     balanced=balanced)


CASES = [(0, 2, 4, 0.3), (1, 4, 2, 0.3), (2, 2, 3, 0.3), (3, 3, 2, 0.5), (4, 2, 4, 0.0), (5, 2, 2, 1.0)]


@pytest.mark.parametrize("seed, d_dp, d_pp, small_share", CASES)
def test_with_the_even_cut_the_search_finds_the_brute_force_optimum(seed, d_dp, d_pp, small_share):
    network, tflops, memory = swarm(seed, d_dp, d_pp, small_share=small_share)
    paper = PaperCostModel(network, Payloads.from_model(MODEL, d_dp=d_dp, d_pp=d_pp), d_dp=d_dp, d_pp=d_pp)
    optimum, execution = brute_force(paper, tflops, memory, balanced=False)
    result = live_plan(network, tflops, memory, d_dp=d_dp, d_pp=d_pp, balanced=False, seed=seed)
    if execution is None:  # nothing fits in any way: the search says by how much its plan misses
        assert result.search.best.cost_s >= PENALTY_S_PER_GIB * result.search.best.breakdown.short_gib > 0
        return
    assert_priced_as_found(result, tflops, memory, network, optimum, execution)


@pytest.mark.parametrize("seed, d_dp, d_pp, small_share",
                         [(2, 2, 3, 0.3), (3, 3, 2, 0.5), (5, 2, 2, 1.0), (10, 2, 3, 0.3), (13, 4, 2, 0.0)])
def test_with_cuts_chosen_per_placement_the_search_finds_the_brute_force_optimum(seed, d_dp, d_pp, small_share):
    """The brute force tries every cut of the 8 layers too; the search cuts each placement it prices
    (`LiveCostModel.balanced_cut`). Slow groups get fewer layers: far below the even cut's optimum."""
    network, tflops, memory = swarm(seed, d_dp, d_pp, small_share=small_share)
    paper = PaperCostModel(network, Payloads.from_model(MODEL, d_dp=d_dp, d_pp=d_pp), d_dp=d_dp, d_pp=d_pp)
    optimum, execution = brute_force(paper, tflops, memory, balanced=True)
    result = live_plan(network, tflops, memory, d_dp=d_dp, d_pp=d_pp, balanced=True, seed=seed)
    assert_priced_as_found(result, tflops, memory, network, optimum, execution)


@pytest.mark.parametrize("seed", [20, 21, 22])
def test_the_shape_chosen_is_the_fastest_brute_force_optimum_of_the_shapes_it_tries(seed):
    """Four devices, every stage count, as many pipelines as all of them and each faster tier fill, on the fastest
    devices (the rest standbys): each shape's price is its brute-force optimum, and the shape chosen is the fastest
    of them."""
    network, tflops, memory = swarm(seed, 2, 2, small_share=0.3)
    shaped = find_shaped_plan(network, Hardware(model=MODEL, tflops=tflops, memory_gib=memory), d_pp=None,
                              config=SearchConfig(time_budget_s=60, seed=seed))
    assert shaped.untried_stages == [] and {stages for _, stages in shaped.shapes} == {1, 2, 3, 4}
    fastest = sorted(range(4), key=lambda d: (-tflops[d], -memory[d], d))
    optima = {}
    for count, stages in shaped.shapes:
        placed = sorted(fastest[:count * stages])
        paper = PaperCostModel(network.subset(placed), Payloads.from_model(MODEL, d_dp=count, d_pp=stages),
                               d_dp=count, d_pp=stages)
        optima[(count, stages)] = brute_force(paper, tflops[placed], memory[placed], balanced=True)[0]
    assert shaped.shapes == pytest.approx({shape: None if step == np.inf else step for shape, step in optima.items()},
                                          rel=1e-9)
    assert shaped.predicted_step_s == pytest.approx(min(optima.values()), rel=1e-9)
    assert len(shaped.placed) == shaped.result.plan.grid.size


def assert_priced_as_found(result, tflops: np.ndarray, memory: np.ndarray, network: Network, optimum: float,
                           execution: Execution) -> None:
    """The plan runs the way the brute force's optimum does, costs what it costs, and the search's own price of it
    is the live model's; deployed, its pipelines are no slower."""
    found, deployed = searched_and_deployed(result.plan, tflops, memory, network.latency_ms, result.execution)
    assert result.execution.option == execution.option
    assert found.total_s == pytest.approx(optimum, rel=1e-9)
    assert result.search.best.cost_s == pytest.approx(found.total_s, rel=1e-9)
    assert deployed.total_s <= found.total_s * (1 + 1e-9)


@pytest.mark.parametrize("d_dp, d_pp", [(2, 4), (4, 2)])
def test_the_objective_prices_any_partition_as_the_live_model_prices_its_slowest_pipeline(d_dp, d_pp):
    network, tflops, memory = swarm(7, d_dp, d_pp, small_share=0.0)  # all fit: predict_step_s refuses the rest
    paper = PaperCostModel(network, Payloads.from_model(MODEL, d_dp=d_dp, d_pp=d_pp), d_dp=d_dp, d_pp=d_pp)
    for balanced in (False, True):
        live = LiveCostModel(paper, Hardware(model=MODEL, tflops=tflops, memory_gib=memory), balanced=balanced)
        cached = CachedEvaluator(live)
        rng = np.random.default_rng(0)
        for _ in range(20):
            candidate = cached.candidate(rng.permutation(8).reshape(d_pp, d_dp))
            execution = live.execution(candidate.breakdown)
            stage_dp_bytes = live.dp_gb[np.arange(d_pp), list(execution.layer_counts)] * BYTES_PER_GB
            plan = plan_from_partition(paper, candidate.partition, candidate.order, stage_dp_bytes,
                                       matched_by=live.hops)
            priced, deployed = searched_and_deployed(plan, tflops, memory, network.latency_ms, execution)
            assert candidate.cost_s == pytest.approx(priced.total_s, rel=1e-9)
            assert deployed.total_s <= priced.total_s * (1 + 1e-9)  # tests/test_live_cost.py has a looser case


def test_a_stage_that_does_not_fit_is_priced_by_how_much_it_lacks():
    network, tflops, _ = swarm(8, 2, 2)
    paper = PaperCostModel(network, Payloads.from_model(MODEL, d_dp=2, d_pp=2), d_dp=2, d_pp=2)
    roomy = LiveCostModel(paper, Hardware(model=MODEL, tflops=tflops, memory_gib=np.full(4, 1.0)))
    cramped = LiveCostModel(paper, Hardware(model=MODEL, tflops=tflops, memory_gib=np.array([1.0, 1.0, 1.0, 0.01])))
    partition = np.array([[0, 1], [2, 3]])
    fits, short = (CachedEvaluator(model).candidate(partition) for model in (roomy, cramped))
    stage = short.order.index(1)  # the stage device 3's group runs (the lighter one, if it can choose)
    lacking = cramped.need_gib[stage, short.breakdown.layer_counts[stage]] - 0.01
    assert fits.breakdown.short_gib == 0 and short.breakdown.short_gib == pytest.approx(lacking)
    assert short.cost_s == pytest.approx(short.breakdown.live.total_s + PENALTY_S_PER_GIB * lacking)
    assert lacking == pytest.approx(min(cramped.need_gib[s, c] for s, c in enumerate(short.breakdown.layer_counts))
                                    - 0.01)


def test_devices_are_twins_for_the_search_only_with_the_same_hardware():
    network = Network.from_matrices(np.full((4, 4), 10.0) - 10 * np.eye(4), np.full((4, 4), 1.0), sites=["dc"] * 4)
    paper = PaperCostModel(network, Payloads.from_model(MODEL, d_dp=2, d_pp=2), d_dp=2, d_pp=2)
    live = LiveCostModel(paper, Hardware(model=MODEL, tflops=np.array([1.0, 1.0, 2.0, 2.0]),
                                         memory_gib=np.array([1.0, 1.0, 1.0, 0.5])))
    assert len(set(network.twin_classes)) == 1
    assert live.classes[0] == live.classes[1] and len(set(live.classes)) == 3


def test_the_greedy_baseline_puts_the_fastest_devices_first():
    network, _, _ = swarm(9, 2, 3)
    paper = PaperCostModel(network, Payloads.from_model(MODEL, d_dp=2, d_pp=3), d_dp=2, d_pp=3)
    plan = greedy_placement(paper, np.array([1.0, 5.0, 3.0, 5.0, 2.0, 4.0]))
    assert plan.grid.tolist() == [[1, 3], [5, 2], [4, 0]]
