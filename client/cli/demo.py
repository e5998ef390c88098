"""`hetswarm demo`: the thin command in front of hetswarm.client.local.demo."""
from __future__ import annotations

import signal
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.live import Live

from hetswarm.client.cli.options import VerboseOpt, configure_logging, console, err_console
from hetswarm.client.cli.plots import plot_line
from hetswarm.client.local.demo import DEMO_COMPRESSION, DemoConfig, PhaseResult, run_swarm
from hetswarm.client.monitor.render import render_watch, summary_lines
from hetswarm.protocol.errors import RejectedInput

_COMPARED_WITH = {"scheduled": "random", "paper": "scheduled", "random": "scheduled", "default": "scheduled"}


def demo(
    clients: Annotated[int, typer.Option(help="Clients to start (two or more per world-wide region).")] = 8,
    dp: Annotated[int, typer.Option("--dp", help="Pipelines.")] = 2,
    pp: Annotated[Optional[int], typer.Option("--pp", help="Stages (default: clients / dp); fewer leave the other "
                                                           "clients standing by.")] = None,
    steps: Annotated[int, typer.Option(help="Steps to measure the plan on, after the warm-up.")] = 12,
    compare_steps: Annotated[int, typer.Option(help="Steps to measure the comparison plan on.")] = 6,
    plan: Annotated[str, typer.Option(help="scheduled, paper, random or default: the plan trained first "
                                           "(`hetswarm coordinator --plan`).")] = "scheduled",
    compare: Annotated[bool, typer.Option(help="Then train a second plan on the same clients and compare "
                                               "(random, or scheduled when --plan is not).")] = True,
    model: Annotated[str, typer.Option(help="Model preset.")] = "tiny",
    compression: Annotated[str, typer.Option(help="The coordinator's policy for the wire: model, none, fp16, 8bit, "
                                                  "auto, aq-sgd, sparse, powersgd or aq-powersgd (default: the winner of "
                                                  "benchmarks/compression.py).")] = DEMO_COMPRESSION,
    data_period: Annotated[Optional[int], typer.Option(help="Steps per pass over a repeating data order "
                                                            "(aq-sgd and aq-powersgd need one).")] = None,
    bandwidth_scale: Annotated[float, typer.Option(help="Emulated bandwidths × this, so the traffic matters.")] = 0.005,
    seed: Annotated[int, typer.Option(help="Seed of the model, the data and the plans.")] = 0,
    eval_every: Annotated[int, typer.Option(help="Steps between held-out losses (0: none).")] = 5,
    workdir: Annotated[Optional[Path], typer.Option(help="Where the logs and plans go (default: a temp folder).")] = None,
    verbose: VerboseOpt = False,
) -> None:
    """Run a whole swarm on this machine: a coordinator and N clients on 127.0.0.1 with world-wide links
    emulated; they measure, schedule and train, and the summary compares measured with predicted step time and
    the plan with a random one. Every process it starts is stopped at the end, and on Ctrl+C."""
    configure_logging(verbose)
    if plan not in _COMPARED_WITH:
        raise RejectedInput(f"--plan must be one of {', '.join(_COMPARED_WITH)}, got {plan!r}")
    placements, counts = (plan, _COMPARED_WITH[plan]) if compare else (plan,), (steps, compare_steps)
    config = DemoConfig(clients=clients, dp=dp, stages=pp, model=model, placements=placements,
                        steps=counts[:len(placements)], bandwidth_scale=bandwidth_scale, seed=seed, workdir=workdir,
                        compression=compression, data_period=data_period, eval_every=eval_every)
    try:
        _run_demo(config, console)
    except KeyboardInterrupt:
        err_console.print("Interrupted: every process the demo started has been stopped.")
        raise typer.Exit(130) from None


def _run_demo(config: DemoConfig, console: Console) -> list[PhaseResult]:
    """`hetswarm demo`: run_swarm with a live view, then the summary and its PNG (demo.png in the work folder);
    says where the logs are either way."""
    workdir: list[Path] = []
    # Ctrl+C and `kill` raise KeyboardInterrupt wherever the demo is, also inside its event loop, whose own SIGINT
    # handler would only cancel the task that happens to run (once seen to let an interrupted demo run on to the end)
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        with Live(console=console, refresh_per_second=2, transient=False) as live:
            phases = run_swarm(config, on_update=lambda watch: live.update(render_watch(watch)),
                               on_workdir=workdir.append)
        console.print()
        for line in summary_lines(phases):  # whole lines, as they are: one holds a sample of model output
            console.print(line, soft_wrap=True, markup=False, highlight=False)
        console.print(plot_line(phases, workdir[0] / "demo.png"), soft_wrap=True)  # loss curves, step times
        return phases
    finally:
        if workdir:
            console.print(f"Logs: {workdir[0]}")


def _interrupt(signum: int, frame) -> None:
    raise KeyboardInterrupt
