"""Plan a network with the scheduler alone: no torch, no hivemind, no swarm.

What `hetswarm schedule` does, minus the CLI: load a scenario (one of the paper's five packaged networks, or a
JSON file of your own), price the model's payloads (c_DP, c_PP) for the plan's shape, run the memetic search and
print the plan's cost and its stage × pipeline grid. Only `hetswarm.coordinator` (numpy/scipy) and
`hetswarm.protocol.model_config` (pure Python) are imported, so this runs where no GPU stack is installed.

    python examples/plan_network.py --scenario worldwide --time-budget 2 --seed 0
    python examples/plan_network.py --scenario my_network.json --json
"""
from __future__ import annotations

import argparse
import json
import math

from hetswarm.coordinator import Payloads, Plan, SearchConfig, find_plan, load_network
from hetswarm.protocol.errors import HetswarmError
from hetswarm.protocol.model_config import MODEL_PRESETS, get_model_config

PAPER_DEVICES = 64
"""The paper plans its 64-device networks as 8 × 8 tasklets; `hetswarm schedule` does the same by default."""


def plan_shape(n_devices: int) -> tuple[int, int]:
    """(D_DP, D_PP) as `hetswarm schedule` picks them: 8 × 8 on 64 devices, else the squarest cut with D_PP ≤ D_DP."""
    if n_devices == PAPER_DEVICES:
        return 8, 8
    d_pp = max(d for d in range(1, math.isqrt(n_devices) + 1) if n_devices % d == 0)
    return n_devices // d_pp, d_pp


def describe(plan: Plan) -> list[str]:
    """The grid as people read it: one line per stage, `site device` per pipeline."""
    return [f"stage {stage}: " + ", ".join(f"{site} {device}" for device, site in zip(devices, sites))
            for stage, (devices, sites) in enumerate(zip(plan.grid.tolist(), plan.sites))]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", default="worldwide",
                        help="datacenter, spot, multi-datacenter, regional, worldwide, case1…case5, or a JSON file")
    parser.add_argument("--model", default="paper-gpt3-xl", choices=sorted(MODEL_PRESETS),
                        help="model whose payloads are priced (the paper's GPT-3 XL by default)")
    parser.add_argument("--time-budget", type=float, default=2.0, help="search wall-clock budget, seconds")
    parser.add_argument("--seed", type=int, default=0, help="seed of the search")
    parser.add_argument("--json", action="store_true", help="print the plan as one JSON object instead")
    args = parser.parse_args(argv)

    try:
        network = load_network(args.scenario)
    except HetswarmError as e:  # an unknown name or a malformed file: one line, exit code 2
        parser.error(str(e))
    d_dp, d_pp = plan_shape(network.n_devices)
    payloads = Payloads.from_model(get_model_config(args.model), d_dp=d_dp, d_pp=d_pp)
    result = find_plan(network, payloads, d_dp=d_dp, d_pp=d_pp,
                       config=SearchConfig(time_budget_s=args.time_budget, seed=args.seed))

    plan, search = result.plan, result.search
    if args.json:
        print(json.dumps({"scenario": network.name, "d_dp": d_dp, "d_pp": d_pp, "seed": args.seed,
                          "stopped_by": search.stopped_by, "generations": search.generations, **plan.to_dict()}))
        return
    print(f"{network.name}: {network.n_devices} devices as {d_pp} stages × {d_dp} pipelines of {args.model}; "
          f"c_DP {payloads.dp_bytes / 1e9:.3f} GB, c_PP {payloads.pp_bytes / 1e9:.3f} GB")
    print("\n".join(describe(plan)))
    print(f"cost {plan.cost_s:.6f} s = DataP {plan.breakdown.data_parallel_s:.6f} s + 2·PipeP "
          f"{plan.breakdown.pipeline_parallel_s:.6f} s")
    print(f"search: {search.generations} generations, {search.evaluations} evaluations, {search.elapsed_s:.2f} s, "
          f"stopped by {search.stopped_by}")
    if network.published_best_cost_s is not None:
        print(f"the paper's published best on this network: {network.published_best_cost_s:.3f} s")


if __name__ == "__main__":
    main()
