"""Operators' settings: `--log-format json` gives one JSON object a line, and every option of `join` and
`coordinator` can come from its HETSWARM_<OPTION> environment variable."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import psutil
import pytest
from typer.testing import CliRunner

from hetswarm.client.cli.app import app
from hetswarm.client.local.swarm import hetswarm_command
from hetswarm.client.peer.addresses import LOOPBACK


def test_an_option_set_by_its_environment_variable_takes_effect(hetswarm_logger_restored):
    env = {"HETSWARM_NEW_SWARM": "1", "HETSWARM_EMULATE": "worldwide", "HETSWARM_SITE": "Atlantis"}
    result = CliRunner().invoke(app, ["join"], env=env)
    assert result.exit_code == 1
    assert "unknown site 'Atlantis'" in str(result.exception)  # the site came from HETSWARM_SITE, nothing else
    help_text = CliRunner().invoke(app, ["coordinator", "--help"], env={"COLUMNS": "200"}).output
    assert "HETSWARM_MIN_PEERS" in help_text and "HETSWARM_INITIAL_PEERS" in help_text


@pytest.mark.timeout(120)
@pytest.mark.swarm
def test_json_log_format_parses_line_by_line(tmp_path):
    out, err = tmp_path / "stdout", tmp_path / "stderr"
    env = dict(os.environ, HETSWARM_LOG_FORMAT="json", HIVEMIND_LOGLEVEL="DEBUG", PYTHONUNBUFFERED="1")
    with open(out, "wb") as stdout, open(err, "wb") as stderr:
        process = subprocess.Popen(hetswarm_command("join", "--new-swarm", "--host-maddrs", LOOPBACK, "--verbose"),
                                   stdout=stdout, stderr=stderr, stdin=subprocess.DEVNULL, env=env)
    tree: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 60
        while "Joined swarm" not in out.read_text() and time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.2)
        assert "Joined swarm" in out.read_text(), err.read_text()[-2000:]
        tree = psutil.Process(process.pid).children(recursive=True)
        time.sleep(2)  # a few loops of the volunteer log at debug level
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=30) == 0
    finally:  # by PID: the client, then its DHT process and p2pd if the client failed to take them down
        if process.poll() is None:
            process.kill()
        process.wait()
        for child in tree:
            try:
                child.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(tree, timeout=5)
    lines = [line for line in err.read_text().splitlines() if line.strip()]
    entries = [json.loads(line) for line in lines]  # every line is one JSON object
    assert all({"time", "level", "logger", "message"} <= entry.keys() for entry in entries)
    loggers = {entry["logger"] for entry in entries}
    assert any(name.startswith("hetswarm.") for name in loggers), loggers
    assert any(name.startswith("hivemind") for name in loggers), loggers  # hivemind's lines are JSON too
    assert any("goodbye" in entry["message"] for entry in entries)
