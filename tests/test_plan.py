"""Plans: deployed pipelines achieve the modelled cost; baselines are priced as deployed; plans serialise."""
from __future__ import annotations

import json

import numpy as np
import pytest

from hetswarm.coordinator.scheduling.baselines import default_placement, random_placement
from hetswarm.coordinator.scheduling.cost_model import InvalidPlanShape, PaperCostModel, Payloads
from hetswarm.coordinator.scheduling.plan import cost_plan, plan_from_partition
from tests.helpers.scheduler_oracles import random_network

PAYLOADS = Payloads(dp_bytes=0.4e9, pp_bytes=0.3e9)


@pytest.mark.parametrize(("n", "d_dp", "d_pp", "seed"), [(12, 3, 4, 0), (12, 4, 3, 1), (24, 6, 4, 2), (40, 20, 2, 3)])
def test_deployed_pipelines_achieve_the_costed_bottleneck(n, d_dp, d_pp, seed):
    """The reference's defect: its deployed matching was not the bottleneck one. Here every hop is priced."""
    model = PaperCostModel(random_network(n, seed, sites=3), PAYLOADS, d_dp=d_dp, d_pp=d_pp)
    partition = np.random.default_rng(seed).permutation(n).reshape(d_pp, d_dp)
    breakdown, order = model.evaluate(partition)
    plan = plan_from_partition(model, partition, order)
    assert plan.cost_s == pytest.approx(breakdown.total_s)
    for stage in range(d_pp - 1):  # each boundary's slowest deployed hop is the coarsened edge's weight
        hops = model.pp_edge_s[plan.grid[stage], plan.grid[stage + 1]]
        expected = model.link_matching(partition[order[stage]], partition[order[stage + 1]])[0]
        assert hops.max() == pytest.approx(expected)
    assert sorted(map(sorted, plan.stages)) == sorted(map(sorted, partition.tolist()))


def test_cost_plan_charges_a_grid_as_it_stands():
    model = PaperCostModel(random_network(12, 5, sites=2), PAYLOADS, d_dp=3, d_pp=4)
    grid = np.random.default_rng(0).permutation(12).reshape(4, 3)
    plan = cost_plan(model, grid)
    hops = model.pp_edge_s[grid[:-1], grid[1:]]
    assert plan.breakdown.pipeline_parallel_s == pytest.approx(2 * hops.max(axis=1).sum())
    assert plan.bottleneck.time_s == pytest.approx(hops.max())
    assert plan.cost_s >= model.evaluate(grid)[0].total_s - 1e-9  # re-matching and re-ordering can only help


def test_baselines_are_valid_and_default_is_device_order():
    model = PaperCostModel(random_network(12, 2, sites=3), PAYLOADS, d_dp=3, d_pp=4)
    assert default_placement(model).grid.tolist() == np.arange(12).reshape(4, 3).tolist()
    few, many = random_placement(model, samples=5, seed=0), random_placement(model, samples=200, seed=0)
    assert many.cost_s <= few.cost_s
    assert sorted(many.grid.ravel()) == list(range(12))


def test_plan_to_dict_is_json_and_complete():
    model = PaperCostModel(random_network(12, 4, sites=3), PAYLOADS, d_dp=3, d_pp=4)
    data = json.loads(json.dumps(default_placement(model).to_dict()))
    assert data["cost"] == pytest.approx(data["data_parallel_s"] + data["pipeline_parallel_s"])
    assert len(data["stages"]) == 4 and len(data["pipelines"]) == 3
    assert data["pipelines"][1] == [row[1] for row in data["stages"]]
    assert data["bottleneck_link"]["time_s"] > 0 and data["sites"][0][0].startswith("s")


def test_bad_partitions_are_refused():
    model = PaperCostModel(random_network(12, 4), PAYLOADS, d_dp=3, d_pp=4)
    with pytest.raises(InvalidPlanShape, match="exactly once"):
        cost_plan(model, np.zeros((4, 3), dtype=int))
    with pytest.raises(InvalidPlanShape, match="4 groups × 3"):
        cost_plan(model, np.arange(12).reshape(3, 4))
