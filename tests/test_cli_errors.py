"""Bad input on the command line gives one red line and exit code 1, never a traceback.

Every case here fails before any DHT, p2pd or torch work starts, so it runs in-process with typer's CliRunner:
the command must raise a HetswarmError (which `main` turns into the one `error:` line) and print nothing else.
One test runs the real entry point in a subprocess to prove that turn: one line on stderr, exit code 1.
"""
from __future__ import annotations

import subprocess

import pytest
from typer.testing import CliRunner

from hetswarm.client.cli.app import app
from hetswarm.client.local.swarm import hetswarm_command
from hetswarm.protocol.errors import HetswarmError

runner = CliRunner()

BAD_INPUT = [
    pytest.param(["join", "--initial-peers", "garbage"], "--initial-peers: 'garbage' is not a valid multiaddr",
                 id="bad-multiaddr"),
    pytest.param(["join", "--initial-peers", "/ip4/127.0.0.1/tcp/5"], "/ip4/HOST/tcp/PORT/p2p/PEER_ID",
                 id="no-peer-id"),
    pytest.param(["join"], "give --initial-peers", id="join-without-peers-or-new-swarm"),
    pytest.param(["join", "--new-swarm", "--host-maddrs", "/ip4/127.0.0.1/tcp/0", "--emulate", "worldwide",
                  "--site", "Atlantis"], "unknown site 'Atlantis'", id="unknown-site"),
    pytest.param(["join", "--new-swarm", "--emulate", "no-such-scenario", "--site", "Tokyo"],
                 "unknown scenario 'no-such-scenario'", id="unknown-emulated-scenario"),
    pytest.param(["monitor", "--initial-peers", "/ip4/127.0.0.1/tcp/1/p2p/QmNotAPeer"], "not a valid multiaddr",
                 id="bad-monitor-multiaddr"),
    pytest.param(["schedule", "--scenario", "no-such"], "unknown scenario 'no-such'", id="unknown-schedule-scenario"),
    pytest.param(["coordinator", "--new-swarm", "--export-every", "10"], "give --export-every (a positive number "
                 "of steps) and --export-dir together", id="export-every-without-a-folder"),
    pytest.param(["coordinator", "--new-swarm", "--eval-every", "-1"], "--eval-every must be 0 (none) or positive",
                 id="negative-eval-every"),
    pytest.param(["demo", "--eval-every", "-2"], "eval_every >= 0", id="negative-demo-eval-every"),
    pytest.param(["demo", "--plan", "bogus"], "--plan must be one of scheduled, paper, random, default, got 'bogus'",
                 id="bad-demo-plan"),
]

pytestmark = pytest.mark.usefixtures("hetswarm_logger_restored")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("args, message", BAD_INPUT)
def test_bad_input_raises_one_expected_error_and_prints_nothing_else(args, message):
    result = runner.invoke(app, args)
    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, HetswarmError), repr(result.exception)
    assert message in str(result.exception)
    assert "\n" not in str(result.exception).strip()  # `main` prints it as one line
    assert result.stderr.strip() == "" and result.stdout.strip() == "", result.output


@pytest.mark.timeout(120)
@pytest.mark.swarm
def test_real_entry_point_prints_one_error_line_and_exits_1():
    result = subprocess.run(hetswarm_command("join", "--initial-peers", "garbage"), capture_output=True, text=True,
                            timeout=90, stdin=subprocess.DEVNULL)
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ") and "--initial-peers: 'garbage' is not a valid multiaddr" in lines[0]
    assert result.stdout == ""
