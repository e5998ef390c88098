"""The demo's PNG: each plan's loss against steps and against wall-clock time (where a faster plan's advantage
shows), and its measured against its predicted step time.

matplotlib is an optional extra (`pip install hetswarm[plots]`): a volunteer's client never draws, so it should not
pull in a plotting stack. It is imported when a plot is drawn, and drawn with the Agg backend through the
object-oriented API (no pyplot), so that no display is needed and no global backend is switched for the process.
"""
from __future__ import annotations

from pathlib import Path

from hetswarm.client.local.demo import PhaseResult
from hetswarm.protocol.errors import HetswarmError

__all__ = ["PlotUnavailable", "plot_line", "write_demo_plot"]

MISSING_MATPLOTLIB = "matplotlib is not installed; install hetswarm[plots] for the PNG"


class PlotUnavailable(HetswarmError):
    """The plot cannot be drawn here (matplotlib is missing); the demo's results stand without it."""


def write_demo_plot(phases: list[PhaseResult], path: Path) -> Path:
    """Draws the loss curves (mean loss of each plan against steps, and against seconds since the plan's first
    step) beside a bar chart of measured and predicted seconds per step, and writes them to `path` as a PNG.

    Raises:
        PlotUnavailable: matplotlib is not installed.
        ValueError: no phase to draw.
    """
    if not phases:
        raise ValueError("no phase to plot: run_swarm returned none")
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise PlotUnavailable(MISSING_MATPLOTLIB) from None
    figure = Figure(figsize=(15, 4.2), layout="constrained")
    FigureCanvasAgg(figure)
    losses, clock, times = figure.subplots(1, 3, width_ratios=(3, 3, 2))

    for phase in phases:
        steps = sorted(phase.losses)
        label = f"{phase.placement} plan (v{phase.version})"
        losses.plot(steps, [phase.losses[s] for s in steps], marker="o", markersize=3, label=label)
        if phase.held_out:
            held = sorted(phase.held_out)
            losses.plot(held, [phase.held_out[s] for s in held], linestyle=":", marker="s", markersize=4,
                        color=losses.get_lines()[-1].get_color(), label=f"{label}, held-out")
        timed = sorted(phase.loss_times)
        clock.plot([phase.loss_times[s] for s in timed], [phase.losses[s] for s in timed], marker="o", markersize=3,
                   label=label)
    losses.set(title="Loss against steps (dotted: held-out)", xlabel="step", ylabel="mean loss of the last stage")
    clock.set(title="Loss against wall-clock time", xlabel="seconds since the plan's first step",
              ylabel="mean loss of the last stage")
    for axes in (losses, clock):
        if any(phase.losses for phase in phases):
            axes.legend()
        else:
            axes.text(0.5, 0.5, "no loss reported", ha="center", va="center", transform=axes.transAxes)

    names = [phase.placement for phase in phases]
    where = list(range(len(phases)))
    width = 0.38
    times.bar([x - width / 2 for x in where], [p.predicted_step_s for p in phases], width, label="predicted")
    measured = [p.measured_step_s or 0.0 for p in phases]
    bars = times.bar([x + width / 2 for x in where], measured, width, label="measured")
    times.bar_label(bars, labels=["n/a" if p.measured_step_s is None else f"{p.measured_step_s:.2f}" for p in phases],
                    fontsize=8)
    times.set_xticks(where, [f"{name} plan" for name in names])
    times.set(title="Seconds per step", ylabel="s / step")
    times.legend()

    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    return path


def plot_line(phases: list[PhaseResult], path: Path) -> str:
    """The summary's line about the PNG: where it is, or why there is none (the demo succeeds either way)."""
    try:
        return f"Plot: {write_demo_plot(phases, path)}"
    except PlotUnavailable as e:
        return f"Plot: {e}"
