"""The paper-mode cost model against the paper's worked check, hand-computed values and a literal oracle."""
from __future__ import annotations

import numpy as np
import pytest

from hetswarm.coordinator.scheduling.cost_model import InvalidPlanShape, PaperCostModel, Payloads
from hetswarm.protocol.model_config import get_model_config
from hetswarm.protocol.network import PAPER_SCENARIOS, InvalidNetwork, Network, load_network
from tests.helpers.scheduler_oracles import brute_cost, random_network

PAPER = get_model_config("paper-gpt3-xl")


def test_paper_preset_reproduces_the_reference_constants():
    assert PAPER.dp_payload_bytes(8) == 0.65e9  # 1.3e9 params · 4 B · 3/24 layers
    # 2024·2048·2 bytes·(125000/2048)/2^30, read as GB: the reference's typo and unit, kept to reproduce its costs
    assert PAPER.pp_payload_bytes(8) == pytest.approx(0.47124922275543213e9, rel=1e-15)


def test_case1_worked_check_pipelines_inside_nodes():
    """docs/dtfm.md: DP 7·2·(0 + 5.2/(3.125·8)) = 2.912 s, PP 2·7·(3.77/100) = 0.528 s, total 3.440 s."""
    model = PaperCostModel(load_network("case1"), Payloads.from_model(PAPER, d_dp=8, d_pp=8), d_dp=8, d_pp=8)
    stage_groups_across_nodes = np.arange(64).reshape(8, 8).T  # group j = device j of every node
    breakdown, order = model.evaluate(stage_groups_across_nodes)
    assert breakdown.data_parallel_s == pytest.approx(7 * 2 * 5.2 / (3.125 * 8))
    assert breakdown.pipeline_parallel_s == pytest.approx(2 * 7 * 8 * 0.47124922275543213 / 100)
    assert breakdown.total_s == pytest.approx(3.440, abs=5e-4)
    assert sorted(order) == list(range(8))


def test_hand_computed_two_by_two():
    # devices 0,1 in site A (10 ms, 10 Gbit/s), 2,3 in site B; A–B 50 ms, 1 Gbit/s
    latency = np.array([[0, 10, 50, 50], [10, 0, 50, 50], [50, 50, 0, 10], [50, 50, 10, 0]], dtype=float)
    bandwidth = np.array([[1, 10, 1, 1], [10, 1, 1, 1], [1, 1, 1, 10], [1, 1, 10, 1]], dtype=float)
    network = Network.from_matrices(latency, bandwidth, sites=["A", "A", "B", "B"])
    model = PaperCostModel(network, Payloads(dp_bytes=1e9, pp_bytes=0.5e9), d_dp=2, d_pp=2)
    # stage groups {0,1} and {2,3}: DataP = 2·(0.010 + 8·0.5/10) = 0.82; PipeP = 0.050 + 8·0.5/1 = 4.05
    assert model.evaluate([[0, 1], [2, 3]])[0].total_s == pytest.approx(0.82 + 2 * 4.05)
    # stage groups {0,2} and {1,3}: DataP = 2·(0.050 + 8·0.5/1) = 8.1; PipeP = 0.010 + 8·0.5/10 = 0.41
    assert model.evaluate([[0, 2], [1, 3]])[0].total_s == pytest.approx(8.1 + 2 * 0.41)


@pytest.mark.parametrize("seed", range(4))
def test_evaluate_matches_the_literal_definition(seed):
    network = random_network(8, seed, sites=3)
    model = PaperCostModel(network, Payloads(dp_bytes=0.3e9, pp_bytes=0.2e9), d_dp=2, d_pp=4)
    partition = np.random.default_rng(seed).permutation(8).reshape(4, 2)
    expected = brute_cost(network, model.dp_edge_s, model.pp_edge_s, partition.tolist())
    assert model.evaluate(partition)[0].total_s == pytest.approx(expected)


@pytest.mark.parametrize("name", list(PAPER_SCENARIOS) + ["case1", "case5"])
def test_packaged_scenarios_load_by_short_name(name):
    network = load_network(name)
    assert network.n_devices == 64 and network.published_best_cost_s is not None


@pytest.mark.parametrize(
    ("latency", "bandwidth", "message"),
    [
        ([[0, 1, 2], [1, 0, 3]], [[1, 1, 1], [1, 1, 1]], "square"),
        ([[0, 1], [2, 0]], [[1, 1], [1, 1]], "asymmetric"),
        ([[0, -1], [-1, 0]], [[1, 1], [1, 1]], "negative"),
        ([[0, 1], [1, 0]], [[1, 0], [0, 1]], "positive"),
        ([[0, 1], [1, 0]], [[1, -2], [-2, 1]], "positive"),
        ([[0, 1], [1, 0]], [[1, 1, 1], [1, 1, 1], [1, 1, 1]], "bandwidth_gbps is"),
    ],
)
def test_bad_matrices_are_refused_clearly(latency, bandwidth, message):
    with pytest.raises(InvalidNetwork, match=message):
        Network.from_matrices(latency, bandwidth)


def test_degrees_must_multiply_to_the_device_count():
    with pytest.raises(InvalidPlanShape, match="4 × 3 = 12.*16 devices"):
        PaperCostModel(random_network(16, 0), Payloads(dp_bytes=1, pp_bytes=1), d_dp=4, d_pp=3)


def test_unknown_scenario_names_the_choices():
    with pytest.raises(InvalidNetwork, match="worldwide"):
        load_network("atlantis")


def test_twins_are_exactly_the_interchangeable_devices():
    assert len(set(load_network("worldwide").twin_classes)) == 8  # 8 regions of identical devices
    assert len(set(random_network(8, 0, sites=2).twin_classes)) == 8  # random rows: no twins
