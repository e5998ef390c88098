"""`hetswarm schedule` in-process: JSON for scripts, tables for people, one clear error for bad input."""
from __future__ import annotations

import json
from importlib import resources

import pytest
from typer.testing import CliRunner

from hetswarm.client.cli.app import app
from hetswarm.protocol.network import RejectedInput

runner = CliRunner()
CASE1 = str(resources.files("hetswarm.protocol").joinpath("scenarios", "case1_datacenter_on_demand.json"))


def test_scenario_file_alone_reproduces_the_paper_setting():
    result = runner.invoke(app, ["schedule", "--scenario", CASE1, "--json", "--no-baselines"])
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


def test_with_hardware_the_live_objective_is_the_default_and_both_objectives_are_priced_live():
    result = runner.invoke(app, ["schedule", "--scenario", "volunteer-mix", "--json", "--time-budget", "0.5",
                                 "--ga-candidates", "10", "--random-samples", "10"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["objective"] == "live" and set(report["objectives"]) == {"live", "paper"}
    assert report["predicted_step_s"] == report["objectives"]["live"]["predicted_step_s"] > 0
    runs = report["execution"]
    # paper-gpt3-xl at 8 × 8 fits none of these cards with GPipe's stored activations
    assert runs["schedule"] == "1f1b" or runs["recompute"]
    assert sum(b - a for a, b in runs["stage_layers"]) == 24 and len(runs["stage_layers"]) == 8
    greedy = report["baselines"]["greedy placement (fastest devices first)"]
    assert greedy["cost"] > 0 and (greedy["predicted_step_s"] or greedy["infeasible"])
    fitting = [b["predicted_step_s"] for b in report["baselines"].values() if b["predicted_step_s"] is not None]
    assert report["predicted_step_s"] <= min(fitting, default=float("inf"))  # run as the live plan runs, or not at all


def test_the_paper_objective_on_hardware_is_still_priced_live_and_live_needs_hardware():
    result = runner.invoke(app, ["schedule", "--scenario", "mixed-regional", "--objective", "paper", "--json",
                                 "--no-baselines", "--time-budget", "0.5"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["objective"] == "paper" and report["cost"] == report["objectives"]["paper"]["cost"]
    assert "predicted_step_s" in report
    refused = runner.invoke(app, ["schedule", "--scenario", "worldwide", "--objective", "live", "--no-baselines"])
    assert isinstance(refused.exception, RejectedInput) and "TFLOPS and memory" in str(refused.exception)


def test_dp_auto_runs_fewer_faster_pipelines_when_slow_devices_would_hold_every_stage_back():
    result = runner.invoke(app, ["schedule", "--scenario", "mixed-datacenter", "--dp", "auto", "--json",
                                 "--no-baselines", "--time-budget", "2"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    chosen, everyone = report["chosen_shape"], report["objectives"]["live"]
    assert chosen["d_pp"] == 8 and chosen["d_dp"] < 8 and len(chosen["standbys"]) == 64 - 8 * chosen["d_dp"]
    assert chosen["predicted_step_s"] < everyone["predicted_step_s"] / 1.5  # 32 H100s beat 32 H100s + 32 A10s
    placed = {device for stage in chosen["stages"] for device in stage}
    assert placed.isdisjoint(chosen["standbys"]) and report["shapes"]["8x8"] == pytest.approx(
        everyone["predicted_step_s"], rel=0.05)
    refused = runner.invoke(app, ["schedule", "--scenario", "worldwide", "--dp", "auto", "--no-baselines"])
    assert isinstance(refused.exception, RejectedInput)


def test_pp_auto_also_chooses_the_stages_and_fewer_carry_less_over_slow_regional_links():
    """On mixed-regional every 8-stage pipeline waits on its hops inside a region (2 Gbit/s); fewer stages carry
    fewer activations. The shape chosen is the fastest tried, and every stage count is tried or said untried."""
    result = runner.invoke(app, ["schedule", "--scenario", "mixed-regional", "--dp", "auto", "--pp", "auto", "--json",
                                 "--no-baselines", "--time-budget", "4"])  # shared by the shapes: 2 s fell short
    # of the best shape on a loaded 2-core machine (4.56 s/step found against 3.89 s alone)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    chosen, eight_by_eight = report["chosen_shape"], report["objectives"]["live"]
    fitting = {shape: step for shape, step in report["shapes"].items() if step is not None}
    assert min(fitting, key=fitting.get) == f"{chosen['d_dp']}x{chosen['d_pp']}" and chosen["d_pp"] < 8
    assert chosen["predicted_step_s"] <= min(fitting.values()) * (1 + 1e-9)  # deployed, each device at its speed
    assert chosen["predicted_step_s"] < eight_by_eight["predicted_step_s"] / 1.5
    stages_tried = {int(shape.split("x")[1]) for shape in report["shapes"]}
    assert stages_tried | set(report["untried_stages"]) == set(range(1, 25)) and {1, 2} <= stages_tried
    refused = runner.invoke(app, ["schedule", "--scenario", "mixed-regional", "--pp", "auto", "--objective", "paper"])
    assert isinstance(refused.exception, RejectedInput) and "--objective live" in str(refused.exception)


def test_compression_is_priced_as_the_coordinator_sends_it_and_auto_per_link():
    """On regional links (mixed-regional) 8-bit is the fastest wire; auto stays within 5 % of it, keeping fp32 or fp16
    on the transfers whose bytes are off the critical path."""
    reports = {}
    for policy in ("none", "8bit", "auto"):
        result = runner.invoke(app, ["schedule", "--scenario", "mixed-regional", "--model", "small", "--compression",
                                     policy, "--json", "--no-baselines", "--time-budget", "0.5"])
        assert result.exit_code == 0, result.output
        reports[policy] = json.loads(result.stdout)
    wires = {policy: report["wire"] for policy, report in reports.items()}
    assert wires["none"]["codecs"]["activations"] == "fp32" and wires["8bit"]["codecs"]["allreduce"] == "8bit"
    assert reports["8bit"]["payloads"]["pp_bytes"] < reports["none"]["payloads"]["pp_bytes"] / 3.9
    assert wires["8bit"]["predicted_step_s"] < wires["none"]["predicted_step_s"]
    assert wires["auto"]["predicted_step_s"] <= wires["8bit"]["predicted_step_s"] * 1.05 + 1e-9
    auto = wires["auto"]["codecs"]
    assert auto.get("hops") or auto.get("groups") or auto["activations"] != "8bit", auto  # kept some precision


@pytest.mark.parametrize("args, reason", [
    (["--scenario", "worldwide", "--compression", "auto"], "needs a scenario with hardware"),
    (["--scenario", "case1", "--compression", "8bit", "--dp-bytes", "1e6", "--pp-bytes", "1e5"], "give --model"),
    (["--scenario", "case1", "--compression", "zip"], "--compression is one of"),
])
def test_compression_that_cannot_be_priced_is_refused(args, reason):
    refused = runner.invoke(app, ["schedule", *args, "--no-baselines", "--time-budget", "0.2"])
    assert isinstance(refused.exception, RejectedInput) and reason in str(refused.exception), refused.output
