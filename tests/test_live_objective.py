"""The live cost model as the search's objective (coordinator/live_objective.py), checked against brute force: on
small random swarms of mixed speed and memory, the search finds the partition and stage order that the live model
itself (`predict_step_s` of the deployed plan) prices lowest among all of them, and its cost is that price."""
from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest

from hetswarm.coordinator.baselines import greedy_placement
from hetswarm.coordinator.cost_model import PaperCostModel, Payloads
from hetswarm.coordinator.live_cost import NoFeasiblePlan, predict_step_s, stage_memory_bytes
from hetswarm.coordinator.live_objective import PENALTY_S_PER_GIB, Hardware, LiveCostModel
from hetswarm.coordinator.neighbourhood import CachedEvaluator
from hetswarm.coordinator.network import Network
from hetswarm.coordinator.plan import plan_from_partition
from hetswarm.coordinator.scheduler import find_plan
from hetswarm.coordinator.search import SearchConfig
from hetswarm.protocol.model_config import get_model_config
from hetswarm.protocol.units import BYTES_PER_GIB

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


def partitions(devices: tuple[int, ...], size: int):
    """Every split of `devices` into unordered groups of `size` (the first device's group first)."""
    if not devices:
        yield []
        return
    first, rest = devices[0], devices[1:]
    for others in itertools.combinations(rest, size - 1):
        remaining = tuple(d for d in rest if d not in others)
        for tail in partitions(remaining, size):
            yield [[first, *others], *tail]


def brute_force(paper: PaperCostModel, tflops: np.ndarray, memory: np.ndarray) -> float:
    """The lowest live step time over every partition and stage order, as deployed; inf when nothing fits."""
    best = np.inf
    for groups in partitions(tuple(range(paper.n_devices)), paper.d_dp):
        for order in itertools.permutations(range(paper.d_pp)):
            plan = plan_from_partition(paper, np.array(groups), list(order))
            try:
                best = min(best, predict_step_s(plan, MODEL, tflops=tflops, memory_gib=memory,
                                                latency_ms=paper.network.latency_ms).total_s)
            except NoFeasiblePlan:
                continue
    return best


@pytest.mark.parametrize("seed, d_dp, d_pp, small_share",
                         [(0, 2, 4, 0.3), (1, 4, 2, 0.3), (2, 2, 3, 0.3), (3, 3, 2, 0.5), (4, 2, 4, 0.0), (5, 2, 2, 1.0)])
def test_the_search_finds_the_brute_force_optimum_of_the_live_model(seed, d_dp, d_pp, small_share):
    network, tflops, memory = swarm(seed, d_dp, d_pp, small_share=small_share)
    payloads = Payloads.from_model(MODEL, d_dp=d_dp, d_pp=d_pp)
    paper = PaperCostModel(network, payloads, d_dp=d_dp, d_pp=d_pp)
    optimum = brute_force(paper, tflops, memory)
    hardware = Hardware(model=MODEL, tflops=tflops, memory_gib=memory)
    result = find_plan(network, payloads, d_dp=d_dp, d_pp=d_pp, config=SearchConfig(seed=seed), hardware=hardware)
    if np.isinf(optimum):  # nothing fits: the search says by how much its plan misses
        assert result.search.best.cost_s >= PENALTY_S_PER_GIB * result.search.best.breakdown.short_gib > 0
        return
    found = predict_step_s(result.plan, MODEL, tflops=tflops, memory_gib=memory, latency_ms=network.latency_ms)
    assert found.total_s == pytest.approx(optimum, rel=1e-9)
    assert result.search.best.cost_s == pytest.approx(found.total_s, rel=1e-9)  # what it optimised is the price


def test_the_objective_prices_any_partition_as_the_live_model_prices_its_deployment():
    network, tflops, memory = swarm(7, 2, 4, small_share=0.0)  # all fit: predict_step_s refuses plans that do not
    paper = PaperCostModel(network, Payloads.from_model(MODEL, d_dp=2, d_pp=4), d_dp=2, d_pp=4)
    cached = CachedEvaluator(LiveCostModel(paper, Hardware(model=MODEL, tflops=tflops, memory_gib=memory)))
    rng = np.random.default_rng(0)
    for _ in range(20):
        candidate = cached.candidate(rng.permutation(8).reshape(4, 2))
        plan = plan_from_partition(paper, candidate.partition, candidate.order)
        live = predict_step_s(plan, MODEL, tflops=tflops, memory_gib=memory, latency_ms=network.latency_ms)
        assert candidate.cost_s == pytest.approx(live.total_s, rel=1e-9)


def test_a_stage_that_does_not_fit_is_priced_by_how_much_it_lacks():
    network, tflops, _ = swarm(8, 2, 2)
    paper = PaperCostModel(network, Payloads.from_model(MODEL, d_dp=2, d_pp=2), d_dp=2, d_pp=2)
    roomy = LiveCostModel(paper, Hardware(model=MODEL, tflops=tflops, memory_gib=np.full(4, 1.0)))
    cramped = LiveCostModel(paper, Hardware(model=MODEL, tflops=tflops, memory_gib=np.array([1.0, 1.0, 1.0, 0.01])))
    partition = np.array([[0, 1], [2, 3]])
    fits, short = (CachedEvaluator(model).candidate(partition) for model in (roomy, cramped))
    lacking = cramped.need_gib[fits.order.index(1)] - 0.01  # device 3's group runs that stage
    assert fits.breakdown.short_gib == 0 and short.breakdown.short_gib == pytest.approx(lacking)
    assert short.cost_s == pytest.approx(fits.cost_s + PENALTY_S_PER_GIB * lacking)
    assert cramped.need_gib.max() * BYTES_PER_GIB > 0.01 * BYTES_PER_GIB


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
