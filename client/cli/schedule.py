"""`hetswarm schedule`: plan a stored or captured network with the scheduler and compare it with the baselines.

It imports neither torch nor hivemind (tests/test_import_doors.py), so it starts at once and runs on a laptop:
`hetswarm schedule ...` runs ``schedule_app``, which holds this command alone (client/cli/__init__.py).
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from hetswarm.client.cli.options import JsonOpt, VerboseOpt, configure_logging, console, err_console, new_app
from hetswarm.coordinator.baselines import default_placement, random_placement
from hetswarm.coordinator.cost_model import InvalidPlanShape, PaperCostModel, Payloads
from hetswarm.coordinator.live_cost import NoFeasiblePlan, predict_step_s
from hetswarm.coordinator.network import SCENARIOS, Network, load_network
from hetswarm.coordinator.paper_ga import paper_ga
from hetswarm.coordinator.plan import Plan, plan_from_partition
from hetswarm.coordinator.scheduler import find_plan
from hetswarm.coordinator.search import SearchConfig, SearchProgress
from hetswarm.coordinator.swarm_view import load_hardware
from hetswarm.protocol.errors import RejectedInput
from hetswarm.protocol.model_config import MODEL_PRESETS, load_model_config

PAPER_MODEL = "paper-gpt3-xl"
PAPER_DEVICES = 64
"""A 64-device network is planned as the paper plans it (8 × 8, paper-gpt3-xl) unless told otherwise."""




def schedule(
    scenario: Annotated[str, typer.Option(help=f"Scenario ({', '.join(SCENARIOS)}, case1…case5) or a JSON file.")],
    dp: Annotated[int | None, typer.Option("--dp", help="D_DP: pipelines (devices per stage group).")] = None,
    pp: Annotated[int | None, typer.Option("--pp", help="D_PP: pipeline stages.")] = None,
    model: Annotated[str, typer.Option(help=f"Model for payloads: {', '.join(MODEL_PRESETS)} or a JSON file "
                                            "(a saved plan's model).")] = PAPER_MODEL,
    dp_bytes: Annotated[float | None, typer.Option(help="c_DP in bytes (with --pp-bytes, instead of --model).")] = None,
    pp_bytes: Annotated[float | None, typer.Option(help="c_PP in bytes (with --dp-bytes, instead of --model).")] = None,
    seed: Annotated[int, typer.Option(help="Seed of the search and the baselines.")] = 0,
    time_budget: Annotated[float, typer.Option("--time-budget", help="Search wall-clock budget, seconds.")] = 5.0,
    baselines: Annotated[bool, typer.Option(help="Also run random and default placement and the paper's GA.")] = True,
    ga_candidates: Annotated[int, typer.Option(help="Candidates of the paper's GA baseline (paper: 5000).")] = 1000,
    random_samples: Annotated[int, typer.Option(help="Random placements drawn; the best is reported.")] = 5000,
    plot: Annotated[Path | None, typer.Option(help="Draw the plan on the link matrix (PNG; needs matplotlib).")] = None,
    json_output: JsonOpt = False,
    verbose: VerboseOpt = False,
) -> None:
    """Plan which device runs which (stage, replica) on a network, under the DT-FM cost model.

    Prints the plan grid (stage × replica, with site names), its cost breakdown and bottleneck link, and a
    comparison with random placement, default (device-order) placement and the paper's GA. A 64-device
    scenario defaults to the paper's setting: 8 × 8 tasklets of GPT-3 XL (`paper-gpt3-xl`). A plan saved by
    `hetswarm coordinator --save-plan` is a scenario too, with the peers' TFLOPS and memory: then the live cost
    model's predicted step time is reported as well (`predicted_step_s`).
    """
    configure_logging(verbose)
    network = load_network(scenario)
    d_dp, d_pp = _degrees(network.n_devices, dp, pp)
    payloads = _payloads(model, dp_bytes, pp_bytes, d_dp=d_dp, d_pp=d_pp)
    config = SearchConfig(time_budget_s=time_budget, seed=seed)
    with err_console.status("searching…", spinner="dots") as status:
        def on_progress(progress: SearchProgress) -> None:
            status.update(f"searching: best {progress.best_cost_s:.3f} s after {progress.generation} generations, "
                          f"{progress.elapsed_s:.1f} s")

        result = find_plan(network, payloads, d_dp=d_dp, d_pp=d_pp, config=config,
                           progress=None if json_output else on_progress)
        comparison = _baselines(network, payloads, d_dp=d_dp, d_pp=d_pp, seed=seed, ga_candidates=ga_candidates,
                                random_samples=random_samples) if baselines else {}
    report = {
        "scenario": network.name,
        "d_dp": d_dp,
        "d_pp": d_pp,
        "payloads": {"dp_bytes": payloads.dp_bytes, "pp_bytes": payloads.pp_bytes},
        "cost": result.plan.cost_s,
        "search": {"elapsed_s": result.search.elapsed_s, "generations": result.search.generations,
                   "evaluations": result.search.evaluations, "stopped_by": result.search.stopped_by, "seed": seed},
        "published_best_cost_s": network.published_best_cost_s,
        "plan": result.plan.to_dict(),
        "baselines": comparison,
    }
    hardware = load_hardware(scenario) if dp_bytes is None else None
    if hardware is not None:
        try:
            live = predict_step_s(result.plan, load_model_config(model), tflops=hardware[0], memory_gib=hardware[1],
                                  latency_ms=network.latency_ms)
            report |= {"predicted_step_s": live.total_s, "breakdown": live.to_dict()}
        except NoFeasiblePlan as e:  # the plan is still shown: which stage does not fit, and where
            report |= {"predicted_step_s": None, "infeasible": str(e)}
    if plot is not None:
        _plot(network, result.plan, plot)
    if json_output:
        console.print_json(json.dumps(report))
    else:
        _print_report(network, result.plan, report)


def _degrees(n_devices: int, dp: int | None, pp: int | None) -> tuple[int, int]:
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


def _payloads(model: str, dp_bytes: float | None, pp_bytes: float | None, *, d_dp: int, d_pp: int) -> Payloads:
    if (dp_bytes is None) != (pp_bytes is None):
        raise RejectedInput("give both --dp-bytes and --pp-bytes, or neither (then --model sets them)")
    if dp_bytes is not None:
        return Payloads(dp_bytes=dp_bytes, pp_bytes=pp_bytes)
    return Payloads.from_model(load_model_config(model), d_dp=d_dp, d_pp=d_pp)


def _baselines(network: Network, payloads: Payloads, *, d_dp: int, d_pp: int, seed: int, ga_candidates: int,
               random_samples: int) -> dict[str, Any]:
    model = PaperCostModel(network, payloads, d_dp=d_dp, d_pp=d_pp)
    ga = paper_ga(model, candidates=ga_candidates, seed=seed)
    ga_plan = plan_from_partition(model, ga.best.partition, ga.best.order)
    return {
        f"random placement (best of {random_samples})": random_placement(model, samples=random_samples,
                                                                          seed=seed).cost_s,
        "default placement (device order)": default_placement(model).cost_s,
        f"paper GA ({ga.candidates} candidates, {ga.elapsed_s:.1f} s)": ga_plan.cost_s,
    }


def _print_report(network: Network, plan: Plan, report: dict[str, Any]) -> None:
    grid = Table(title=f"Plan for {network.name}: stage × pipeline (site, device)")
    grid.add_column("stage")
    for replica in range(plan.grid.shape[1]):
        grid.add_column(f"p{replica}")
    for stage, (devices, sites) in enumerate(zip(plan.grid, plan.sites)):
        grid.add_row(str(stage), *(f"{site} {device}" for device, site in zip(devices, sites)))
    console.print(grid)
    breakdown = plan.breakdown
    console.print(f"cost {breakdown.total_s:.3f} s = DataP {breakdown.data_parallel_s:.3f} s + 2·PipeP "
                  f"{breakdown.pipeline_parallel_s:.3f} s  (search {report['search']['elapsed_s']:.2f} s, "
                  f"stopped by {report['search']['stopped_by']})")
    if report.get("infeasible"):
        console.print(f"live model: the plan does not fit: {report['infeasible']}")
    elif "predicted_step_s" in report:
        parts = ", ".join(f"{k} {v:.3f}" for k, v in report["breakdown"].items() if k != "step_s")
        console.print(f"live model: predicted step {report['predicted_step_s']:.3f} s ({parts})")
    if plan.bottleneck is not None:
        link = plan.bottleneck
        a, b = link.devices
        console.print(f"bottleneck link: stage {link.stage}→{link.stage + 1} of pipeline {link.pipeline}, "
                      f"{network.sites[a]} {a} → {network.sites[b]} {b}, {link.time_s:.3f} s")
    table = Table(title="Comparison (seconds of the DT-FM cost model)")
    table.add_column("plan")
    table.add_column("cost", justify="right")
    table.add_row("hetswarm search", f"{plan.cost_s:.3f}")
    for name, cost in report["baselines"].items():
        table.add_row(name, f"{cost:.3f}")
    if network.published_best_cost_s is not None:
        table.add_row("paper's published best", f"{network.published_best_cost_s:.3f}")
    console.print(table)


def _plot(network: Network, plan: Plan, path: Path) -> None:
    """Bandwidth matrix with devices in plan order (stage-major), stage boundaries drawn: optional matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        err_console.print("[yellow]--plot skipped: matplotlib is not installed[/yellow]")
        return
    order = plan.grid.ravel()
    figure, axes = plt.subplots(figsize=(7, 6))
    image = axes.imshow(network.bandwidth_gbps[order][:, order], cmap="viridis")
    for boundary in range(1, plan.grid.shape[0]):
        position = boundary * plan.grid.shape[1] - 0.5
        axes.axhline(position, color="white", linewidth=0.8)
        axes.axvline(position, color="white", linewidth=0.8)
    axes.set_title(f"{network.name}: bandwidth (Gbit/s), devices by stage; cost {plan.cost_s:.3f} s")
    figure.colorbar(image, ax=axes)
    figure.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(figure)


schedule_app = new_app(add_completion=False)
schedule_app.command()(schedule)
