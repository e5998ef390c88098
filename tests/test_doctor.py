"""`hetswarm doctor`: one verdict line per check, exit code 0 on a healthy swarm and 1 when a check fails.

Run as a user runs it, a separate process, against the observed swarm on 127.0.0.1 (tests/helpers/shared_swarm.py:
a coordinator and two `hetswarm join` clients), and against an initial peer that does not exist; a bad multiaddr is refused in-process before anything starts.
"""
from __future__ import annotations

import re
import socket
import subprocess
import time

import pytest
import torch
from typer.testing import CliRunner

from hetswarm.client.cli.app import app
from hetswarm.client.cli.doctor import gpu_cache_check
from hetswarm.client.local.swarm import hetswarm_command
from hetswarm.client.peer.addresses import LOOPBACK
from hetswarm.client.peer.hardware import probe_hardware
from hetswarm.protocol.errors import HetswarmError
from tests.helpers.shared_swarm import ObservedSwarm

CHECKS = ["p2p daemon", "bootstrap peers", "swarm records", "reachability", "clock", "GPU probe cache", "versions"]
LINE = re.compile(r"^(ok|warn|FAIL|skip) +(p2p daemon|bootstrap peers|swarm records|reachability|clock|"
                  r"GPU probe cache|versions) +(\S.*)$")
MADE_UP_PEER = "QmQ6eFsQ8xvTfyWMxkXHJ4rJ1yQ5ajcbK9ReKjECnaswkD"


def run_doctor(*args: str, timeout_s: float) -> tuple[subprocess.CompletedProcess, dict[str, str], float]:
    """The command's result, its verdict by check, and how long it took."""
    start = time.monotonic()
    result = subprocess.run(hetswarm_command("doctor", "--host-maddrs", LOOPBACK, *args), capture_output=True,
                            text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
    verdicts = {m.group(2): m.group(1) for m in map(LINE.match, result.stdout.splitlines()) if m}
    return result, verdicts, time.monotonic() - start


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.timeout(180)
@pytest.mark.swarm
def test_against_a_live_swarm_every_check_passes_or_warns(observed_swarm: ObservedSwarm):
    swarm = observed_swarm.swarm
    result, verdicts, took_s = run_doctor("--initial-peers", swarm.initial_peers, "--swarm", swarm.swarm,
                                          timeout_s=120)
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    assert list(verdicts) == CHECKS, result.stdout
    assert "FAIL" not in verdicts.values() and "skip" not in verdicts.values(), result.stdout
    for check in ("p2p daemon", "bootstrap peers", "swarm records", "reachability", "clock"):
        assert verdicts[check] == "ok", result.stdout  # its clients are in view: they dial back and tell their time
    assert took_s < 90


@pytest.mark.timeout(120)
@pytest.mark.swarm
def test_a_dead_initial_peer_fails_the_bootstrap_check_fast():
    dead = f"/ip4/127.0.0.1/tcp/{closed_port()}/p2p/{MADE_UP_PEER}"
    result, verdicts, took_s = run_doctor("--initial-peers", dead, "--timeout", "5", timeout_s=90)
    assert result.returncode == 1, result.stdout + result.stderr[-3000:]
    assert list(verdicts) == CHECKS, result.stdout
    assert verdicts["p2p daemon"] == "ok" and verdicts["bootstrap peers"] == "FAIL", result.stdout
    assert "connection refused" in result.stdout
    assert {verdicts[c] for c in ("swarm records", "reachability", "clock")} == {"skip"}
    assert took_s < 60



@pytest.mark.timeout(60)
@pytest.mark.usefixtures("hetswarm_logger_restored")
def test_a_bad_multiaddr_is_one_expected_error():
    result = CliRunner().invoke(app, ["doctor", "--initial-peers", "/ip4/127.0.0.1/tcp/1/p2p/QmNotAPeer"])
    assert result.exit_code == 1
    assert isinstance(result.exception, HetswarmError) and "not a valid multiaddr" in str(result.exception)
    assert result.stdout.strip() == ""  # refused before any check ran


def test_gpu_cache_check_reads_what_probe_hardware_writes(tmp_path):
    device = torch.device("cpu")
    cache = tmp_path / "throughput.json"
    assert gpu_cache_check(device, cache).verdict == "warn"  # never measured: join will measure
    probe_hardware(device, cache_path=cache)  # a 1024² fp32 matmul on the CPU: well under a second
    assert gpu_cache_check(device, cache).verdict == "ok"
    cache.write_text("{not json")
    broken = gpu_cache_check(device, cache)
    assert broken.verdict == "FAIL" and "delete it" in broken.hint  # join would crash on it


def test_the_cache_is_where_the_environment_says_when_asked_not_when_imported(tmp_path, monkeypatch):
    # a child forked from the preimported server sets its environment after hetswarm's modules were imported
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    device = torch.device("cpu")
    assert gpu_cache_check(device).verdict == "warn"
    probe_hardware(device)
    assert (tmp_path / "hetswarm" / "throughput.json").exists()
    assert gpu_cache_check(device).verdict == "ok"
