"""Does planning on the live model pay on mixed GPUs? `hetswarm schedule` on the four heterogeneous scenarios.

For each scenario (paper-gpt3-xl): the paper objective's plan at the paper's 8 × 8, the live objective's plan on all
64 devices at 8 × 8, and the live objective with `--dp auto --pp auto` (the shape chosen too: fewer or more stages, and
fewer pipelines where much slower devices stand by), beside the paper objective on the shape and devices the
live objective chose, greedy (fastest devices first), random and default placement, all priced by the live model and
run the way the live plan runs (its micro-batches and recomputation; the plans that know no cut get the even one).
Writes the "hetero-scheduler" section of benchmarks/RESULTS.md.

    python benchmarks/hetero_schedule.py [--time-budget 5] [--ga-candidates 1000]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys

from results import command_line, write_section  # benchmarks/ is on sys.path when run as a script

from hetswarm.coordinator.scheduling.cost_model import Payloads
from hetswarm.coordinator.scheduling.live_cost import Execution, NoFeasiblePlan, predict_step_s
from hetswarm.coordinator.scheduling.live_objective import fitting
from hetswarm.coordinator.scheduling.scheduler import find_plan
from hetswarm.coordinator.scheduling.search import SearchConfig
from hetswarm.protocol.model_config import get_model_config
from hetswarm.protocol.network import HARDWARE_SCENARIOS, load_hardware, load_network

MODEL = get_model_config("paper-gpt3-xl")


def schedule(scenario: str, *, budget_s: float, ga_candidates: int, seed: int) -> dict:
    """`hetswarm schedule --dp auto --pp auto --json` on one scenario, as a user runs it."""
    command = [sys.executable, "-m", "hetswarm.client.cli", "schedule", "--scenario", scenario, "--dp", "auto",
               "--pp", "auto", "--json", "--time-budget", str(budget_s), "--ga-candidates", str(ga_candidates),
               "--seed", str(seed)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, check=True)
    return json.loads(done.stdout)


def paper_step(scenario: str, *, d_dp: int, d_pp: int, placed: list[int] | None = None, runs: dict | None = None,
               budget_s: float, seed: int) -> tuple[float | None, Execution]:
    """The paper objective's plan of d_dp × d_pp on the `placed` devices (all of them by default) with the even
    cut, run the live plan's way (`runs`, its `execution`) or else the first way it fits by itself (`fitting`: it
    may take more micro-batches than the live plan, which the live model rewards with a smaller bubble); its
    predicted step seconds (None where it does not fit) and how it ran."""
    network, (tflops, memory) = load_network(scenario), load_hardware(scenario)
    placed = placed if placed is not None else list(range(network.n_devices))
    network, tflops, memory = network.subset(placed), tflops[placed], memory[placed]
    payloads = Payloads.from_model(MODEL, d_dp=d_dp, d_pp=d_pp)
    plan = find_plan(network, payloads, d_dp=d_dp, d_pp=d_pp,
                     config=SearchConfig(time_budget_s=budget_s, seed=seed)).plan
    execution = fitting(MODEL, memory[plan.grid]) if runs is None else Execution.even(
        MODEL, d_pp, micro_batches=runs["micro_batches"], recompute=runs["recompute"], schedule=runs["schedule"])
    try:
        return predict_step_s(plan, MODEL, tflops=tflops, memory_gib=memory, latency_ms=network.latency_ms,
                              execution=execution).total_s, execution
    except NoFeasiblePlan:
        return None, execution


def paper_run_its_own_way(scenario: str, *, budget_s: float, seed: int) -> str:
    """The paper objective's 8 × 8 plan run the first way it fits by itself."""
    step_s, execution = paper_step(scenario, d_dp=8, d_pp=8, budget_s=budget_s, seed=seed)
    if step_s is None:
        return "does not fit"
    return f"{step_s:.2f} ({execution.micro_batches} µb{', recompute' if execution.recompute else ''})"


def paper_at_chosen_shape(scenario: str, chosen: dict, *, budget_s: float, seed: int) -> str:
    """The paper objective's plan on the devices and shape the live objective chose, run the live plan's way: how
    much of the gain the shape alone gives."""
    placed = sorted({device for stage in chosen["stages"] for device in stage})
    step_s, _ = paper_step(scenario, d_dp=chosen["d_dp"], d_pp=chosen["d_pp"], placed=placed,
                           runs=chosen["execution"], budget_s=budget_s, seed=seed)
    return "does not fit" if step_s is None else f"{step_s:.2f}"


def _step(priced: dict) -> str:
    return "does not fit" if priced.get("predicted_step_s") is None else f"{priced['predicted_step_s']:.2f}"


def _row(scenario: str, report: dict, own_way: str, paper_shaped: str) -> str:
    live, paper, chosen = report["objectives"]["live"], report["objectives"]["paper"], report["chosen_shape"]
    baselines = {name.split(" (")[0]: priced for name, priced in report["baselines"].items()}
    best = chosen if chosen.get("predicted_step_s") is not None else live
    gain = (f"{paper['predicted_step_s'] / best['predicted_step_s']:.2f}×" if paper.get("predicted_step_s")
            else "paper's does not fit")
    runs = best["execution"]
    cut = "/".join(str(b - a) for a, b in runs["stage_layers"])
    return (f"| {scenario} | {_step(paper)} | {own_way} | {_step(live)} | {_step(chosen)} ({chosen['d_dp']}×{chosen['d_pp']}) "
            f"| {paper_shaped} | {_step(baselines['greedy placement'])} | {_step(baselines['random placement'])} "
            f"| {_step(baselines['default placement'])} | {gain} | {cut}, {runs['micro_batches']} µb"
            f"{', recompute' if runs['recompute'] else ''} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-budget", type=float, default=5.0, help="seconds per search")
    parser.add_argument("--ga-candidates", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rows = []
    for scenario in HARDWARE_SCENARIOS:
        report = schedule(scenario, budget_s=args.time_budget, ga_candidates=args.ga_candidates, seed=args.seed)
        own_way = paper_run_its_own_way(scenario, budget_s=args.time_budget, seed=args.seed)
        paper_shaped = paper_at_chosen_shape(scenario, report["chosen_shape"], budget_s=args.time_budget,
                                             seed=args.seed)
        rows.append(_row(scenario, report, own_way, paper_shaped))
        print(rows[-1], flush=True)
    write_section("hetero-scheduler", "\n".join([
        "## Scheduler on mixed GPUs: live objective vs paper objective",
        "",
        f"`{command_line()}`",
        "",
        "paper-gpt3-xl, 64 devices; predicted step seconds (live model, coordinator/scheduling/live_cost.py: "
        "all-reduces + compute at each stage's slowest device, bubble and per-micro-batch hops + commit vote). Every "
        "plan runs the way the live plan runs; a plan "
        "that knows no cut gets the even one.",
        "",
        "| scenario | paper objective (8×8) | paper objective, run its own way | live objective (8×8) "
        "| live, shape chosen | paper objective, that shape | greedy (8×8) | random (8×8) | default (8×8) "
        "| live vs paper | how the best live plan runs |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
        *rows,
        "",
        "The live plan runs the first way that fits (GPipe, then 1F1B with more micro-batches, then recomputing), "
        "or a later one predicted at least 5 % faster (scheduler.WAY_MARGIN; more micro-batches shrink the bubble "
        "and cost a latency per hop each). \"Run its own way\": the paper plan run the first way its even cut "
        "fits (`fitting`). \"Paper objective, that shape\": the paper objective's plan on the devices and shape "
        "the live objective chose, even cut, run the live plan's way; it shows how much of the gain is the shape's.",
    ]))


if __name__ == "__main__":
    main()
