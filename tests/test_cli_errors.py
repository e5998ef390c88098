"""Bad input on the command line gives one red line and exit code 1, never a traceback."""
from __future__ import annotations

import subprocess

import pytest

from hetswarm.client.local.swarm import hetswarm_command

pytestmark = pytest.mark.timeout(120)


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(hetswarm_command(*args), capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("args, message", [
    (["join", "--initial-peers", "garbage"], "--initial-peers: 'garbage' is not a valid multiaddr"),
    (["join", "--initial-peers", "/ip4/127.0.0.1/tcp/5"], "/ip4/HOST/tcp/PORT/p2p/PEER_ID"),
    (["join"], "give --initial-peers"),
    (["join", "--new-swarm", "--host-maddrs", "/ip4/127.0.0.1/tcp/0", "--emulate", "worldwide", "--site", "Atlantis"],
     "unknown site 'Atlantis'"),
    (["join", "--new-swarm", "--emulate", "no-such-scenario", "--site", "Tokyo"], "unknown scenario"),
    (["monitor", "--initial-peers", "/ip4/127.0.0.1/tcp/1/p2p/QmNotAPeer"], "not a valid multiaddr"),
])
def test_bad_input_is_one_line_on_stderr(args, message):
    result = run_cli(*args)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and message in lines[0], result.stderr
