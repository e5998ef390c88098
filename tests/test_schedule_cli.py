"""`hetswarm schedule` in-process: JSON for scripts, tables for people, one clear error for bad input."""
from __future__ import annotations

import json
from importlib import resources

from typer.testing import CliRunner

from hetswarm.client.cli import app
from hetswarm.coordinator.network import RejectedInput

runner = CliRunner()
CASE1 = str(resources.files("hetswarm.coordinator").joinpath("scenarios", "case1_datacenter_on_demand.json"))


def test_scenario_file_alone_reproduces_the_paper_setting():
    result = runner.invoke(app, ["schedule", "--scenario", CASE1, "--json", "--no-baselines", "--time-budget", "2"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["cost"] <= 3.440 + 1e-3
    assert (report["d_dp"], report["d_pp"]) == (8, 8)
    assert report["payloads"]["dp_bytes"] == 0.65e9


def test_human_output_has_grid_breakdown_and_comparison():
    result = runner.invoke(app, ["schedule", "--scenario", "multi-datacenter", "--time-budget", "1",
                                 "--ga-candidates", "20", "--random-samples", "50"])
    assert result.exit_code == 0, result.output
    for text in ("Ohio", "DataP", "bottleneck link", "random placement", "paper GA", "published best"):
        assert text in result.stdout


def test_explicit_degrees_and_payloads():
    result = runner.invoke(app, ["schedule", "--scenario", "regional", "--dp", "16", "--pp", "4", "--dp-bytes", "1e8",
                                 "--pp-bytes", "1e8", "--json", "--no-baselines", "--time-budget", "1"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert len(report["plan"]["stages"]) == 4 and len(report["plan"]["stages"][0]) == 16
    assert report["cost"] > 0


def test_bad_input_is_a_rejected_input_error():
    for args in (["--scenario", "atlantis"], ["--scenario", "worldwide", "--dp", "7"],
                 ["--scenario", "worldwide", "--dp-bytes", "5"]):
        result = runner.invoke(app, ["schedule", *args, "--no-baselines"])
        assert result.exit_code != 0
        assert isinstance(result.exception, RejectedInput), result.exception
