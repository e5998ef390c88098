"""`hetswarm schedule`: plan a stored or captured network with the scheduler and compare it with the baselines.

It imports neither torch nor hivemind (tests/test_import_doors.py), so it starts at once and runs on a laptop:
`hetswarm schedule ...` runs ``schedule_app``, which holds this command alone (client/cli/__init__.py).
"""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer
from rich.table import Table

from hetswarm.client.cli.options import JsonOpt, VerboseOpt, configure_logging, console, err_console, new_app
from hetswarm.coordinator.scheduling.baselines import baseline_plans
from hetswarm.coordinator.scheduling.cost_model import PaperCostModel, Payloads
from hetswarm.coordinator.scheduling.live_cost import Execution, NoFeasiblePlan, predict_step_s
from hetswarm.coordinator.scheduling.live_objective import Hardware
from hetswarm.coordinator.scheduling.plan import Plan
from hetswarm.coordinator.scheduling.scheduler import ShapedResult, find_plan, find_shaped_plan, plan_degrees
from hetswarm.coordinator.scheduling.search import SearchConfig, SearchProgress
from hetswarm.coordinator.scheduling.wire_choice import choose_wire
from hetswarm.protocol.errors import RejectedInput
from hetswarm.protocol.model_config import MODEL_PRESETS, ModelConfig, load_model_config
from hetswarm.protocol.network import SCENARIOS, Network, load_hardware, load_network
from hetswarm.protocol.wire_format import COMPRESSION_POLICIES, WireFormat, candidate_wires

PAPER_MODEL = "paper-gpt3-xl"
"""A 64-device network is planned as the paper plans it (8 × 8, paper-gpt3-xl) unless told otherwise."""




def schedule(
    scenario: Annotated[str, typer.Option(help=f"Scenario ({', '.join(SCENARIOS)}, case1…case5) or a JSON file.")],
    dp: Annotated[str | None, typer.Option("--dp", help="D_DP: pipelines (devices per stage group); `auto` lets the "
                                                       "live objective choose, leaving devices 2× slower than the "
                                                       "rest as standbys where that is faster.")] = None,
    pp: Annotated[str | None, typer.Option("--pp", help="D_PP: pipeline stages; `auto` lets the live objective "
                                                       "choose, from one to the model's layers.")] = None,
    model: Annotated[str, typer.Option(help=f"Model for payloads: {', '.join(MODEL_PRESETS)} or a JSON file "
                                            "(a saved plan's model).")] = PAPER_MODEL,
    dp_bytes: Annotated[float | None, typer.Option(help="c_DP in bytes (with --pp-bytes, instead of --model).")] = None,
    pp_bytes: Annotated[float | None, typer.Option(help="c_PP in bytes (with --dp-bytes, instead of --model).")] = None,
    objective: Annotated[str | None, typer.Option(
        help="What the search minimises: `live`, the step time on these devices (compute, bubble, memory; needs a "
             "scenario with hardware, its default), or `paper`, DT-FM's communication cost.")] = None,
    seed: Annotated[int, typer.Option(help="Seed of the search and the baselines.")] = 0,
    time_budget: Annotated[float, typer.Option("--time-budget", help="Search wall-clock budget, seconds.")] = 5.0,
    baselines: Annotated[bool, typer.Option(help="Also run random and default placement, the paper's GA and, with "
                                                 "hardware, greedy placement (fastest devices first).")] = True,
    ga_candidates: Annotated[int, typer.Option(help="Candidates of the paper's GA baseline (paper: 5000).")] = 1000,
    random_samples: Annotated[int, typer.Option(help="Random placements drawn; the best is reported.")] = 5000,
    compression: Annotated[str, typer.Option(
        help=f"Codecs of the plan's transfers, priced as the coordinator's --compression would send them: "
             f"{', '.join(COMPRESSION_POLICIES)}; `auto` chooses one per hop and stage group (needs hardware).")
    ] = "model",
    plot: Annotated[Path | None, typer.Option(help="Draw the plan on the link matrix (PNG; needs matplotlib).")] = None,
    json_output: JsonOpt = False,
    verbose: VerboseOpt = False,
) -> None:
    """Plan which device runs which (stage, replica) on a network, under the live cost model or DT-FM's.

    Prints the plan grid (stage × replica, with site names), its cost breakdown and bottleneck link, and a
    comparison with random placement, default (device-order) placement and the paper's GA. A 64-device
    scenario defaults to the paper's setting: 8 × 8 tasklets of GPT-3 XL (`paper-gpt3-xl`). On a scenario with
    hardware (TFLOPS and memory per device: the heterogeneous scenarios, or a plan saved by `hetswarm coordinator
    --save-plan`) the search minimises the live model's step time by default, cutting the layers unevenly and
    recomputing activations where that makes stages fit; every plan is then also priced live
    (`predicted_step_s`), the other objective's plan included, and greedy placement joins the baselines.
    """
    configure_logging(verbose)
    network = load_network(scenario)
    choose_dp, choose_pp = dp == "auto", pp == "auto"
    d_dp, d_pp = plan_degrees(network.n_devices, None if choose_dp else _number("--dp", dp),
                              None if choose_pp else _number("--pp", pp))
    wires = _wires(compression, model, given_bytes=dp_bytes is not None or pp_bytes is not None)
    payloads = _payloads(model, dp_bytes, pp_bytes, d_dp=d_dp, d_pp=d_pp, wire=wires[-1] if wires else None)
    hardware = _hardware(scenario, model, known=dp_bytes is None)
    if compression == "auto" and hardware is None:
        raise RejectedInput("--compression auto chooses codecs by the live model's step time: it needs a scenario "
                            "with hardware")
    objective = objective or ("live" if hardware is not None else "paper")
    if objective not in ("live", "paper"):
        raise RejectedInput(f"--objective is live or paper, got {objective!r}")
    if (choose_dp or choose_pp) and objective != "live":
        raise RejectedInput("--dp auto and --pp auto choose the shape by predicted step time: they need --objective "
                            "live")
    if objective == "live" and hardware is None:
        raise RejectedInput(f"--objective live needs each device's TFLOPS and memory: {scenario!r} has none (use a "
                            "heterogeneous scenario or a saved plan, or --objective paper)")
    config = SearchConfig(time_budget_s=time_budget, seed=seed)
    with err_console.status("searching…", spinner="dots") as status:
        def on_progress(progress: SearchProgress) -> None:
            status.update(f"searching ({objective}): best {progress.best_cost_s:.3f} s after {progress.generation} "
                          f"generations, {progress.elapsed_s:.1f} s")

        progress = None if json_output else on_progress
        searches = {"paper": find_plan(network, payloads, d_dp=d_dp, d_pp=d_pp, config=config, progress=progress)}
        if hardware is not None:  # the coordinator's search, on the same inputs
            searches["live"] = find_plan(network, payloads, d_dp=d_dp, d_pp=d_pp, config=config, progress=progress,
                                         hardware=hardware)
        shaped = find_shaped_plan(network, hardware, d_pp=None if choose_pp else d_pp,
                                  d_dp=None if choose_dp else d_dp, config=config) if choose_dp or choose_pp else None
        runs = searches["live"].execution if hardware is not None else None
        comparison = _baselines(network, payloads, d_dp=d_dp, d_pp=d_pp, seed=seed, ga_candidates=ga_candidates,
                                random_samples=random_samples, hardware=hardware, runs=runs) if baselines else {}
    result = searches[objective]
    report = {
        "scenario": network.name,
        "objective": objective,
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
    if hardware is not None:
        priced = {name: _live_price(found.plan, hardware, network, found.execution or _even(runs, hardware.model))
                  for name, found in searches.items()}
        report |= priced[objective] | {"objectives": {name: {"cost": searches[name].plan.cost_s} | price
                                                      for name, price in priced.items()}}
        report["wire"] = _wire_report(compression, network, hardware, result.plan.grid, wires,
                                      result.execution or _even(runs, hardware.model))
    if shaped is not None:
        report |= _shaped_report(shaped, hardware, network)
    if plot is not None:
        _plot(network, result.plan, plot)
    if json_output:
        console.print_json(json.dumps(report))
    else:
        _print_report(network, result.plan, report)


def _hardware(scenario: str, model: str, *, known: bool) -> Hardware | None:
    """The devices' TFLOPS and memory, when the scenario has them and the payloads come from a model."""
    found = load_hardware(scenario) if known else None
    if found is None:
        return None
    return Hardware(model=load_model_config(model), tflops=found[0], memory_gib=found[1])


def _live_price(plan: Plan, hardware: Hardware, network: Network, execution: Execution) -> dict[str, Any]:
    """`predicted_step_s`, its breakdown and how the stages run; or why the plan does not fit."""
    runs = {"execution": {"stage_layers": execution.stage_layers, "micro_batches": execution.micro_batches,
                          "recompute": execution.recompute, "schedule": execution.schedule}}
    try:
        live = predict_step_s(plan, hardware.model, tflops=hardware.tflops, memory_gib=hardware.memory_gib,
                              latency_ms=network.latency_ms, execution=execution)
    except NoFeasiblePlan as e:  # the plan is still shown: which stage does not fit, and where
        return {"predicted_step_s": None, "infeasible": str(e)} | runs
    return {"predicted_step_s": live.total_s, "breakdown": live.to_dict()} | runs


def _even(runs: Execution, model: ModelConfig) -> Execution:
    """How a plan that knows no cut (the paper objective's, a baseline's) runs beside the live plan: the model's
    even cut, run the live plan's way, so that only the placements differ."""
    return Execution.even(model, len(runs.layer_counts), **runs.option._asdict())


def _shaped_report(shaped: ShapedResult, hardware: Hardware, network: Network) -> dict[str, Any]:
    """The plan with the shape chosen (`--dp auto`, `--pp auto`), in the scenario's device ids, and the shapes
    tried."""
    placed = np.asarray(shaped.placed)
    sub = network.subset(shaped.placed)
    hardware = replace(hardware, tflops=hardware.tflops[placed], memory_gib=hardware.memory_gib[placed])
    plan = shaped.result.plan
    priced = _live_price(plan, hardware, sub, shaped.result.execution)
    d_pp, d_dp = plan.grid.shape
    return {"chosen_shape": {"d_dp": d_dp, "d_pp": d_pp, "stages": placed[plan.grid].tolist(),
                             "standbys": sorted(set(range(network.n_devices)) - set(shaped.placed)),
                             "cost": plan.cost_s} | priced,
            "shapes": {f"{dp}x{pp}": step for (dp, pp), step in shaped.shapes.items()},
            "untried_stages": shaped.untried_stages}


def _number(option: str, value: str | None) -> int | None:
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        raise RejectedInput(f"{option} must be a number or auto, got {value!r}") from None


def _wires(policy: str, model: str, *, given_bytes: bool) -> list[WireFormat] | None:
    """The wires `policy` chooses among (protocol/wire_format.py); None when the payloads are given in bytes."""
    if policy not in COMPRESSION_POLICIES:
        raise RejectedInput(f"--compression is one of {', '.join(COMPRESSION_POLICIES)}, got {policy!r}")
    if given_bytes:
        if policy != "model":
            raise RejectedInput("--compression prices a model's values in its codecs: give --model, not "
                                "--dp-bytes and --pp-bytes")
        return None
    return candidate_wires(policy, load_model_config(model))


def _payloads(model: str, dp_bytes: float | None, pp_bytes: float | None, *, d_dp: int, d_pp: int,
              wire: WireFormat | None) -> Payloads:
    if (dp_bytes is None) != (pp_bytes is None):
        raise RejectedInput("give both --dp-bytes and --pp-bytes, or neither (then --model sets them)")
    if dp_bytes is not None:
        return Payloads(dp_bytes=dp_bytes, pp_bytes=pp_bytes)
    return Payloads.from_model(load_model_config(model), d_dp=d_dp, d_pp=d_pp, wire=wire)


def _wire_report(policy: str, network: Network, hardware: Hardware, grid: np.ndarray, wires: list[WireFormat],
                 execution: Execution) -> dict[str, Any]:
    """The wire the coordinator would send the plan's transfers in under `policy`, and the step it predicts."""
    try:
        chosen = choose_wire(network, hardware, grid, wires, execution)
    except NoFeasiblePlan as e:
        return {"policy": policy, "infeasible": str(e)}
    return {"policy": policy, "codecs": chosen.wire.to_dict(), "text": chosen.wire.describe(),
            "predicted_step_s": chosen.live.total_s}


def _baselines(network: Network, payloads: Payloads, *, d_dp: int, d_pp: int, seed: int, ga_candidates: int,
               random_samples: int, hardware: Hardware | None, runs: Execution | None) -> dict[str, dict[str, Any]]:
    """Each baseline's paper cost and, with hardware, its live price (`_even`)."""
    plans = baseline_plans(PaperCostModel(network, payloads, d_dp=d_dp, d_pp=d_pp), seed=seed,
                           ga_candidates=ga_candidates, random_samples=random_samples,
                           tflops=hardware.tflops if hardware is not None else None)
    return {name: {"cost": plan.cost_s} | (_live_price(plan, hardware, network, _even(runs, hardware.model))
                                           if hardware is not None else {})
            for name, plan in plans.items()}


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
        runs = report["execution"]
        cut = "/".join(str(b - a) for a, b in runs["stage_layers"])
        console.print(f"live model: predicted step {report['predicted_step_s']:.3f} s ({parts}); layers {cut}, "
                      f"{runs['micro_batches']} micro-batches{', 1F1B' if runs['schedule'] == '1f1b' else ''}"
                      f"{', recomputing activations' if runs['recompute'] else ''}")
    if (wire := report.get("wire")) and "codecs" in wire:
        console.print(f"wire ({wire['policy']}): {wire['text']}; predicted step {wire['predicted_step_s']:.3f} s")
    if plan.bottleneck is not None:
        link = plan.bottleneck
        a, b = link.devices
        console.print(f"bottleneck link: stage {link.stage}→{link.stage + 1} of pipeline {link.pipeline}, "
                      f"{network.sites[a]} {a} → {network.sites[b]} {b}, {link.time_s:.3f} s")
    if "chosen_shape" in report:
        chosen = report["chosen_shape"]
        fits = "does not fit" if chosen.get("infeasible") else f"predicted step {chosen['predicted_step_s']:.3f} s"
        untried = report["untried_stages"]
        left = f"; no time left for {len(untried)} stage counts from {untried[0]}" if untried else ""
        console.print(f"shape chosen: {chosen['d_dp']} pipelines × {chosen['d_pp']} stages, {fits}; "
                      f"{len(chosen['standbys'])} standbys (best of each stage count tried: "
                      f"{_best_per_stage_count(report['shapes'])}{left})")
    live = "objectives" in report
    table = Table(title="Comparison: DT-FM cost" + (" and predicted step (live model), seconds" if live else
                                                     ", seconds"))
    table.add_column("plan")
    table.add_column("DT-FM cost", justify="right")
    if live:
        table.add_column("predicted step", justify="right")
    rows = [(f"hetswarm search ({name} objective)", priced) for name, priced in report.get("objectives", {}).items()]
    rows = rows or [("hetswarm search", {"cost": plan.cost_s})]
    if "chosen_shape" in report:
        chosen = report["chosen_shape"]
        rows.append((f"hetswarm search (live objective, shape chosen: {chosen['d_dp']} × {chosen['d_pp']})", chosen))
    rows += list(report["baselines"].items())
    for name, priced in rows:
        step = "does not fit" if priced.get("infeasible") else f"{priced.get('predicted_step_s') or 0:.3f}"
        table.add_row(name, f"{priced['cost']:.3f}", *([step] if live else []))
    if network.published_best_cost_s is not None:
        table.add_row("paper's published best", f"{network.published_best_cost_s:.3f}", *([""] if live else []))
    console.print(table)


def _best_per_stage_count(shapes: dict[str, float | None]) -> str:
    """`{"24x2": 3.9, "16x2": 5.6, ...}` → "24x2 3.888 s, ...": one shape per stage count, the fastest that fits."""
    best: dict[str, tuple[str, float | None]] = {}
    for shape, step in shapes.items():
        stages = shape.split("x")[1]
        held = best.get(stages)
        if held is None or (step is not None and (held[1] is None or step < held[1])):
            best[stages] = (shape, step)
    return ", ".join(f"{shape} {'does not fit' if step is None else f'{step:.3f} s'}" for shape, step in best.values())


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
