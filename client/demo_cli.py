"""`hetswarm demo`: the thin command in front of hetswarm.client.demo."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from hetswarm.client.cli_options import VerboseOpt, configure_logging, console, err_console
from hetswarm.client.demo import DemoConfig, run_demo
from hetswarm.protocol.errors import RejectedInput

_COMPARED_WITH = {"scheduled": "random", "random": "scheduled", "default": "scheduled"}


def demo(
    clients: Annotated[int, typer.Option(help="Clients to start (two per world-wide region).")] = 8,
    dp: Annotated[int, typer.Option("--dp", help="Pipelines; the stages are clients / dp.")] = 2,
    steps: Annotated[int, typer.Option(help="Steps to measure the plan on, after the warm-up.")] = 12,
    compare_steps: Annotated[int, typer.Option(help="Steps to measure the comparison plan on.")] = 6,
    plan: Annotated[str, typer.Option(help="scheduled, random or default: the plan trained first.")] = "scheduled",
    compare: Annotated[bool, typer.Option(help="Then train a second plan on the same clients and compare "
                                               "(random, or scheduled when --plan is not).")] = True,
    model: Annotated[str, typer.Option(help="Model preset.")] = "tiny",
    bandwidth_scale: Annotated[float, typer.Option(help="Emulated bandwidths × this, so the traffic matters.")] = 0.005,
    seed: Annotated[int, typer.Option(help="Seed of the model, the data and the plans.")] = 0,
    workdir: Annotated[Optional[Path], typer.Option(help="Where the logs and plans go (default: a temp folder).")] = None,
    verbose: VerboseOpt = False,
) -> None:
    """Run a whole swarm on this machine: a coordinator and N clients on 127.0.0.1 with world-wide links
    emulated; they measure, schedule and train, and the summary compares measured with predicted step time and
    the plan with a random one. Every process it starts is stopped at the end, and on Ctrl+C."""
    configure_logging(verbose)
    if plan not in _COMPARED_WITH:
        raise RejectedInput(f"--plan must be scheduled, random or default, got {plan!r}")
    placements, counts = (plan, _COMPARED_WITH[plan]) if compare else (plan,), (steps, compare_steps)
    try:
        config = DemoConfig(clients=clients, dp=dp, model=model, placements=placements, steps=counts[:len(placements)],
                            bandwidth_scale=bandwidth_scale, seed=seed, workdir=workdir)
    except ValueError as e:
        raise RejectedInput(str(e)) from None
    try:
        run_demo(config, console)
    except KeyboardInterrupt:
        err_console.print("Interrupted: every process the demo started has been stopped.")
        raise typer.Exit(130) from None
