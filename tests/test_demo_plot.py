"""The demo's PNG: drawn from PhaseResults made by hand, and a clear line instead when matplotlib is missing.

That a real demo run prints the PNG's path and writes it is checked in tests/test_demo.py, on its short run.
"""
from __future__ import annotations

import sys

import pytest

from hetswarm.client.cli.plots import MISSING_MATPLOTLIB, PlotUnavailable, plot_line, write_demo_plot
from hetswarm.client.local.demo import PhaseResult

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def phase(placement: str, version: int, *, predicted: float, measured: float | None, steps: int) -> PhaseResult:
    return PhaseResult(placement=placement, version=version, predicted_step_s=predicted, breakdown={}, first_step=0,
                       wire="8bit everywhere", measured_step_s=measured, compute_s=0.1, wait_s=0.2,
                       losses={step: 5.0 - 0.1 * step for step in range(steps)},
                       loss_times={step: measured * step for step in range(steps)} if measured else {})


PHASES = [phase("scheduled", 1, predicted=1.2, measured=1.4, steps=15),
          phase("random", 2, predicted=3.0, measured=None, steps=8)]  # a plan whose step time was not measured


def test_the_plot_is_a_png_of_both_plans(tmp_path):
    path = write_demo_plot(PHASES, tmp_path / "out" / "demo.png")
    assert path == tmp_path / "out" / "demo.png"
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC
    assert len(data) > 10_000  # axes, two curves and bars, not an empty canvas


def test_a_plan_without_losses_still_plots(tmp_path):
    bare = PhaseResult(placement="default", version=1, predicted_step_s=0.5, breakdown={}, first_step=0,
                       wire="fp32 everywhere")
    assert write_demo_plot([bare], tmp_path / "demo.png").read_bytes()[:8] == PNG_MAGIC


def test_no_phase_is_a_caller_error(tmp_path):
    with pytest.raises(ValueError, match="no phase"):
        write_demo_plot([], tmp_path / "demo.png")


@pytest.fixture
def without_matplotlib(monkeypatch):
    """`import matplotlib...` raises ImportError, as where the plots extra is not installed."""
    for name in ("matplotlib", "matplotlib.figure", "matplotlib.backends", "matplotlib.backends.backend_agg"):
        monkeypatch.setitem(sys.modules, name, None)


def test_without_matplotlib_the_summary_says_what_to_install(tmp_path, without_matplotlib):
    with pytest.raises(PlotUnavailable, match=r"install hetswarm\[plots\] for the PNG"):
        write_demo_plot(PHASES, tmp_path / "demo.png")
    assert plot_line(PHASES, tmp_path / "demo.png") == f"Plot: {MISSING_MATPLOTLIB}"
    assert not (tmp_path / "demo.png").exists()


def test_with_matplotlib_the_summary_names_the_png(tmp_path):
    assert plot_line(PHASES, tmp_path / "demo.png") == f"Plot: {tmp_path / 'demo.png'}"
