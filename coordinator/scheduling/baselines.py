"""Plans the scheduler is compared with: random placement, the default (device-order) placement, and on devices of
mixed speeds the greedy one (fastest first).

Both are deployed as they come, stages in index order and no matching, and priced by `cost_plan`, as the paper's
random baseline is (docs/dtfm.md, The reference search). The paper's own search is in paper_ga.py; `baseline_plans`
runs them all for `hetswarm schedule`.
"""
from __future__ import annotations

import numpy as np

from hetswarm.coordinator.scheduling.cost_model import PaperCostModel
from hetswarm.coordinator.scheduling.paper_ga import paper_ga
from hetswarm.coordinator.scheduling.plan import Plan, cost_plan, plan_from_partition

__all__ = ["baseline_plans", "default_placement", "greedy_placement", "random_placement"]


def default_placement(model: PaperCostModel) -> Plan:
    """Device order as Megatron ranks it (pipeline stage outermost): stage s runs on devices [s·D_DP, (s+1)·D_DP)."""
    return cost_plan(model, np.arange(model.n_devices).reshape(model.d_pp, model.d_dp))


def random_placement(model: PaperCostModel, *, samples: int = 5000, seed: int = 0) -> Plan:
    """The best of `samples` uniformly random grids (the paper draws 5,000), deployed without matching."""
    if samples < 1:
        raise ValueError(f"samples must be at least 1, got {samples}")
    rng = np.random.default_rng(seed)
    best: Plan | None = None
    for _ in range(samples):
        plan = cost_plan(model, rng.permutation(model.n_devices).reshape(model.d_pp, model.d_dp))
        if best is None or plan.cost_s < best.cost_s:
            best = plan
    assert best is not None
    return best


def greedy_placement(paper: PaperCostModel, tflops: np.ndarray) -> Plan:
    """Fastest devices first: stage s runs on the (s+1)-th block of D_DP devices by TFLOPS (ties by device id),
    deployed as it comes, stages in block order, as the others are."""
    order = sorted(range(paper.n_devices), key=lambda device: (-float(tflops[device]), device))
    return cost_plan(paper, np.array(order).reshape(paper.d_pp, paper.d_dp))


def baseline_plans(model: PaperCostModel, *, seed: int, ga_candidates: int, random_samples: int,
                   tflops: np.ndarray | None = None) -> dict[str, Plan]:
    """The baselines `hetswarm schedule` compares its plan with, by name: random (best of `random_samples`), device
    order, the paper's GA, and, given the devices' `tflops`, greedy."""
    ga = paper_ga(model, candidates=ga_candidates, seed=seed)
    plans = {
        f"random placement (best of {random_samples})": random_placement(model, samples=random_samples, seed=seed),
        "default placement (device order)": default_placement(model),
        f"paper GA ({ga.candidates} candidates, {ga.elapsed_s:.1f} s)": plan_from_partition(
            model, ga.best.partition, ga.best.order),
    }
    if tflops is not None:
        plans["greedy placement (fastest devices first)"] = greedy_placement(model, tflops)
    return plans
