"""How does the live objective's search scale? Volunteer swarms of 1,024 devices and more, each planned within its
budget, beside a run ten times longer and random placement.

The devices are the scheduler benchmark's geo-distributed swarm (benchmarks/scheduler.py: the ten regions of the
paper's world-wide table, each device behind its own access link), each given a GPU drawn from the volunteer-mix
scenario's cards; paper-gpt3-xl, 16 stages. Writes the "live-scale" section of benchmarks/RESULTS.md. With
`--scenarios`, the same comparison on the 64-device heterogeneous scenarios (the "live-64" section).

    python benchmarks/live_scale.py [--sizes 1024:60:10 4096:300:2]
    python benchmarks/live_scale.py --sizes --scenarios mixed-datacenter:5:24 mixed-regional:5:24 ...
"""
from __future__ import annotations

import argparse
import time

import numpy as np
from results import command_line, write_section  # benchmarks/ is on sys.path when run as a script
from scheduler import geo_swarm

from hetswarm.coordinator.scheduling.cost_model import PaperCostModel, Payloads
from hetswarm.coordinator.scheduling.live_cost import NoFeasiblePlan, predict_step_s
from hetswarm.coordinator.scheduling.live_objective import Hardware, fitting
from hetswarm.coordinator.scheduling.plan import cost_plan
from hetswarm.coordinator.scheduling.scheduler import find_plan
from hetswarm.coordinator.scheduling.search import SearchConfig
from hetswarm.protocol.model_config import get_model_config
from hetswarm.protocol.network import Network, load_hardware, load_network

MODEL = get_model_config("paper-gpt3-xl")
CARDS = {"T4": (65.0, 14.9, 0.45), "RTX 4090": (165.2, 22.35, 0.25), "RTX 3090": (71.0, 22.35, 0.15),
         "RTX 3080": (59.5, 9.31, 0.12), "A100 80GB": (312.0, 74.51, 0.03)}
"""Card → (TFLOPS, GiB, share of the swarm), the volunteer-mix scenario's figures."""


def hardware(n_devices: int, seed: int) -> Hardware:
    rng = np.random.default_rng(seed)
    tflops, memory, share = (np.array(column) for column in zip(*CARDS.values()))
    cards = rng.choice(len(CARDS), size=n_devices, p=share / share.sum())
    return Hardware(model=MODEL, tflops=tflops[cards], memory_gib=memory[cards])


def random_price(paper: PaperCostModel, devices: Hardware, latency: np.ndarray, *, samples: int, seed: int
                 ) -> float:
    """The best live price of `samples` random grids, each run the first way it fits with the even cut (`fitting`,
    as the coordinator runs a random placement); inf when none fits."""
    rng, best = np.random.default_rng(seed), np.inf
    for _ in range(samples):
        grid = rng.permutation(paper.n_devices).reshape(paper.d_pp, paper.d_dp)
        execution = fitting(MODEL, devices.memory_gib[grid])
        try:
            best = min(best, predict_step_s(cost_plan(paper, grid), MODEL, tflops=devices.tflops,
                                            memory_gib=devices.memory_gib, latency_ms=latency,
                                            execution=execution).total_s)
        except NoFeasiblePlan:
            continue
    return best


def compare(label: str, network: Network, devices: Hardware, d_pp: int, budget_s: float, longer: float,
            args: argparse.Namespace) -> str:
    """One swarm: the search at `budget_s`, a run `longer` times as long from the same seed, and random placement."""
    d_dp = network.n_devices // d_pp
    payloads = Payloads.from_model(MODEL, d_dp=d_dp, d_pp=d_pp)
    runs = []
    for budget in (budget_s, budget_s * longer):
        started = time.perf_counter()
        result = find_plan(network, payloads, d_dp=d_dp, d_pp=d_pp, hardware=devices,
                           config=SearchConfig(time_budget_s=budget, seed=args.seed))
        runs.append((result, time.perf_counter() - started))
        print(f"{label}, budget {budget:.0f} s: {result.search.best.cost_s:.3f} s/step in {runs[-1][1]:.0f} s "
              f"({result.search.stopped_by})", flush=True)
    (short, short_s), (long, long_s) = runs
    paper = PaperCostModel(network, payloads, d_dp=d_dp, d_pp=d_pp)
    rand = random_price(paper, devices, network.latency_ms, samples=args.random_samples, seed=args.seed)
    gap = short.search.best.cost_s / long.search.best.cost_s - 1
    return (f"| {label} | {d_pp} × {d_dp} | **{short.search.best.cost_s:.3f}** | {short_s:.0f} | "
            f"{short.search.stopped_by} | {long.search.best.cost_s:.3f} ({longer:g}×) | {long_s:.0f} | {gap:+.1%} | "
            f"{rand:.3f} | {rand / short.search.best.cost_s:.2f}× | {short.execution.describe()} |")


def table(rows: list[str], args: argparse.Namespace) -> list[str]:
    return ["| swarm | D_PP × D_DP | search (s/step) | wall (s) | stopped by | longer run (s/step) | its wall (s) "
            f"| gap | random, best of {args.random_samples} | gain vs random | how it runs |",
            "|---|---|---|---|---|---|---|---|---|---|---|", *rows]


def geo_rows(specs: list[str], args: argparse.Namespace) -> None:
    rows = []
    for spec in specs:
        devices, budget_s, longer = spec.split(":")
        n = int(devices)
        rows.append(compare(str(n), geo_swarm(n, args.seed), hardware(n, args.seed), args.stages, float(budget_s),
                            float(longer), args))
    write_section("live-scale", "\n".join([
        "## Live objective at scale: volunteer swarms of 1,024 devices and more",
        "",
        f"`{command_line()}` on the project's 2-core machine.",
        "",
        "The scheduler benchmark's geo-distributed swarm, each device with a card drawn from the volunteer-mix "
        f"scenario's; paper-gpt3-xl, {args.stages} stages. Predicted step seconds (live model). The longer run "
        "searches as many times as long (in brackets) from the same seed. Random placements run the first way "
        "they fit with the even cut, as the coordinator runs them. The wall time is the whole plan's "
        "(coordinator/scheduling/scheduler.py `find_plan`). The search columns price what the search optimises, every hop at "
        "its boundary's slowest pipeline's (coordinator/scheduling/live_objective.py), which bounds the plan's price as "
        "deployed from above, while random placements are priced as deployed: the gains vs random are at least "
        "those shown.",
        "",
        *table(rows, args),
        "",
        "Targets: 1,024 devices in ≤ 60 s and 4,096 in ≤ 5 min, each within 5 % of a run 10× as long.",
    ]))


def scenario_rows(specs: list[str], args: argparse.Namespace) -> None:
    rows = []
    for spec in specs:
        name, budget_s, longer = spec.split(":")
        tflops, memory = load_hardware(name)
        rows.append(compare(name, load_network(name), Hardware(model=MODEL, tflops=tflops, memory_gib=memory), 8,
                            float(budget_s), float(longer), args))
    write_section("live-64", "\n".join([
        "## Live objective on 64 devices: the default budget beside a long run",
        "",
        f"`{command_line()}` on the project's 2-core machine.",
        "",
        "The heterogeneous scenarios, paper-gpt3-xl, 8 stages; the same columns as the scale table.",
        "",
        *table(rows, args),
        "",
        "Target: the 5 s plan within 2 % of what a 120 s run finds.",
    ]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="*", default=["1024:60:10"],
                        help="DEVICES:BUDGET_S:LONGER geo-distributed swarms, the reference LONGER × as long")
    parser.add_argument("--scenarios", nargs="*", default=[],
                        help="SCENARIO:BUDGET_S:LONGER, heterogeneous 64-device scenarios (8 stages)")
    parser.add_argument("--stages", type=int, default=16)
    parser.add_argument("--random-samples", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.sizes:
        geo_rows(args.sizes, args)
    if args.scenarios:
        scenario_rows(args.scenarios, args)


if __name__ == "__main__":
    main()
