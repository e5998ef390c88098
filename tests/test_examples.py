"""Every script in examples/ runs, as a user would run it, and says something checkable: none can rot unseen.

Each script is a subprocess of `sys.executable`; its printed figures are checked against the library itself (the
scheduler's plan and price), against a tolerance (the two-stage pipeline against the single-process step), or
against a real swarm on 127.0.0.1 (the watcher sees the clients started for it).
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from importlib import resources
from pathlib import Path

import numpy as np
import pytest

from hetswarm.client.local.swarm import LocalSwarm
from hetswarm.coordinator import Payloads, SearchConfig, cost_plan, find_plan, load_network
from hetswarm.coordinator.scheduling.cost_model import PaperCostModel
from hetswarm.protocol.model_config import get_model_config
from hetswarm.protocol.network import SCENARIOS

pytestmark = pytest.mark.swarm

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
HEAVY_MODULES = ("torch", "hivemind", "pydantic")
"""What plan_network.py must not import: the scheduler is meant to run where no GPU stack is installed."""


def run_example(script: str, *args: str, timeout_s: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(EXAMPLES / script), *args], capture_output=True, text=True,
                          timeout=timeout_s, stdin=subprocess.DEVNULL)


def run_plan_network_checking_imports(*args: str, timeout_s: float) -> tuple[str, list[str]]:
    """Runs plan_network.py's main in a fresh interpreter, then lists the heavy modules it left in sys.modules."""
    wrapper = textwrap.dedent(f"""
        import runpy, sys
        sys.argv = {["plan_network.py", *args]!r}
        runpy.run_path({str(EXAMPLES / "plan_network.py")!r}, run_name="__main__")
        heavy = sorted(m for m in sys.modules if m.split(".")[0] in {HEAVY_MODULES!r})
        print("HEAVY_MODULES " + " ".join(heavy))
    """)
    result = subprocess.run([sys.executable, "-c", wrapper], capture_output=True, text=True, timeout=timeout_s,
                            stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stderr
    output, _, heavy = result.stdout.rpartition("HEAVY_MODULES")
    return output, heavy.split()


@pytest.fixture
def eight_device_network(tmp_path: Path) -> Path:
    """Every eighth device of the worldwide scenario (one per site): small enough that the search ends on its
    stall limit, not its time budget, so the same seed must give the same plan in any process."""
    data = json.loads(resources.files("hetswarm.protocol").joinpath("scenarios", SCENARIOS["worldwide"]).read_text())
    keep = list(range(0, 64, 8))
    path = tmp_path / "eight_sites.json"
    path.write_text(json.dumps({
        "name": "eight sites",
        "latency_ms_matrix": [[data["latency_ms_matrix"][i][j] for j in keep] for i in keep],
        "bandwidth_gbps_matrix": [[data["bandwidth_gbps_matrix"][i][j] for j in keep] for i in keep],
        "devices": [data["devices"][i] for i in keep],
    }))
    return path


@pytest.mark.timeout(60)
def test_plan_network_gives_the_schedulers_plan_without_torch_or_hivemind(eight_device_network):
    output, heavy = run_plan_network_checking_imports("--scenario", str(eight_device_network), "--seed", "3",
                                                      "--time-budget", "30", "--json", timeout_s=50)
    assert heavy == []
    printed = json.loads(output)
    assert printed["stopped_by"] != "time budget"  # else the comparison below would depend on timing

    network = load_network(str(eight_device_network))
    payloads = Payloads.from_model(get_model_config("paper-gpt3-xl"), d_dp=4, d_pp=2)
    expected = find_plan(network, payloads, d_dp=4, d_pp=2, config=SearchConfig(time_budget_s=30, seed=3)).plan
    assert (printed["d_dp"], printed["d_pp"]) == (4, 2)
    assert printed["cost"] == pytest.approx(expected.cost_s, rel=1e-12)
    assert printed["stages"] == expected.stages


@pytest.mark.timeout(60)
def test_plan_network_prints_a_priced_8x8_grid_of_the_worldwide_network():
    result = run_example("plan_network.py", "--scenario", "worldwide", "--time-budget", "1", "--seed", "0",
                         timeout_s=50)
    assert result.returncode == 0, result.stderr
    rows = re.findall(r"^stage (\d+): (.+)$", result.stdout, flags=re.MULTILINE)
    grid = np.array([[int(cell.split()[-1]) for cell in row.split(", ")] for _, row in rows])  # (d_pp, d_dp)
    assert grid.shape == (8, 8) and sorted(grid.ravel()) == list(range(64))  # every device placed once
    cost_s = float(re.search(r"^cost (\S+) s = DataP", result.stdout, flags=re.MULTILINE).group(1))

    network = load_network("worldwide")
    model = PaperCostModel(network, Payloads.from_model(get_model_config("paper-gpt3-xl"), d_dp=8, d_pp=8),
                           d_dp=8, d_pp=8)
    assert cost_s == pytest.approx(cost_plan(model, grid).cost_s, abs=1e-6)  # the printed grid costs what is printed
    assert 0 < cost_s < 2 * network.published_best_cost_s


@pytest.mark.timeout(60)
def test_two_stages_trained_by_hand_match_the_single_process_reference():
    result = run_example("train_two_stages.py", "--steps", "3", timeout_s=50)
    assert result.returncode == 0, result.stdout + result.stderr
    steps = re.findall(r"^step \d+: loss (\S+) \(reference (\S+)\)", result.stdout, flags=re.MULTILINE)
    assert len(steps) == 3
    losses = [float(loss) for loss, _ in steps]
    assert losses[-1] < losses[0]  # the optimizer steps really train
    worst = float(re.search(r"max abs difference (\S+)", result.stdout).group(1))
    assert worst <= 1e-5


@pytest.mark.timeout(120)
def test_watch_swarm_sees_the_clients_of_a_local_swarm(tmp_path):
    names = ["alice", "bob"]
    swarm = LocalSwarm("examples", workdir=tmp_path, preimported=True)
    try:
        swarm.start_bootstrap(timeout_s=40)
        for name in names:
            swarm.start_client(name, "--ttl", "20", "--probe-bytes", str(2**20))
        result = run_example("watch_swarm.py", "--initial-peers", swarm.initial_peers, "--swarm", swarm.swarm,
                             "--refresh", "1", "--duration", "45", "--until-peers", str(len(names)), "--read-timeout", "5",
                             timeout_s=90)
    finally:
        swarm.close()  # every process it started, reaped by PID
    assert result.returncode == 0, result.stdout + result.stderr
    last = [line for line in result.stdout.splitlines() if line.startswith("t=")][-1]  # --until-peers ended it
    found = re.search(r"peers=(\d+) \[([^\]]*)\] states=(\S+) links=(\d+)/(\d+)", last)
    assert found, result.stdout
    count, seen, states, measured, pairs = found.groups()
    assert (int(count), seen.split(", ")) == (len(names), names)
    assert {state.split(":")[0] for state in states.split(",")} <= {"joining", "ready"}, last
    assert int(pairs) == 1 and int(measured) <= 1
