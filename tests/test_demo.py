"""`hetswarm demo` end to end, as a user runs it: it trains, prints its summary, and leaves no process behind.

The demo runs as a subprocess (it installs signal handlers and starts process trees of its own); a sampler
records every descendant it ever has, so that a process it leaked would be found even after its parent died.
Four clients and three steps keep it short; the full-size run is `benchmarks/swarm.py`.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import psutil
import pytest

from hetswarm.client.local.demo import EXPORT_FOLDER, SAMPLE_PROMPT, SAMPLE_TOKENS
from hetswarm.client.local.swarm import hetswarm_command
from hetswarm.client.training.hf_folder import sample

pytestmark = pytest.mark.swarm


class Descendants:
    """Every process that was ever below `pid`, sampled until stopped."""

    def __init__(self, pid: int) -> None:
        self.seen: dict[int, psutil.Process] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, args=(pid,), daemon=True)
        self._thread.start()

    def _sample(self, pid: int) -> None:
        while not self._stop.is_set():
            try:
                self.seen.update({p.pid: p for p in psutil.Process(pid).children(recursive=True)})
            except psutil.NoSuchProcess:
                return
            time.sleep(0.2)

    def alive(self) -> list[str]:
        self._stop.set()
        self._thread.join()
        alive = []
        for process in self.seen.values():
            try:
                if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                    alive.append(f"{process.pid} {' '.join(process.cmdline())[:120]}")
            except psutil.NoSuchProcess:
                pass
        return alive


def start_demo(workdir: Path, *args: str, env: dict[str, str] | None = None
               ) -> tuple[subprocess.Popen, Descendants]:
    process = subprocess.Popen(hetswarm_command("demo", "--clients", "4", "--workdir", str(workdir), *args),
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True,
                               env=dict(os.environ, **(env or {})))
    return process, Descendants(process.pid)


@pytest.mark.timeout(300)
def test_demo_trains_prints_its_summary_and_leaves_no_process(tmp_path):
    cache_home = tmp_path / "cache"  # nothing measured yet: a fresh machine
    demo, descendants = start_demo(tmp_path, "--steps", "3", "--no-compare", "--eval-every", "2",
                                   env={"XDG_CACHE_HOME": str(cache_home)})
    try:
        output, _ = demo.communicate(timeout=270)
    finally:
        demo.kill()
    assert demo.returncode == 0, output[-4000:]
    took = re.search(r"Loss \(scheduled plan\): [0-9.]+ at step \d+ → [0-9.]+ at step \d+, ([0-9.]+) s later", output)
    assert took and float(took[1]) > 0, output[-4000:]  # the wall-clock time of the curve the PNG also draws
    # measured after steps 1, 3 and 5 (of 2 warm-up + 3), and believed: both pipelines agreed on each
    assert re.search(r"Held-out loss \(scheduled plan\): [0-9.]+ after step 1 → [0-9.]+ after step 5", output), \
        output[-4000:]
    exported = tmp_path / "run-scheduled" / EXPORT_FOLDER  # the trained model, out of the swarm and sampled
    expected = sample(exported, SAMPLE_PROMPT, max_new_tokens=SAMPLE_TOKENS, temperature=0)
    assert f"(greedy; `hetswarm generate {exported}` samples more): {SAMPLE_PROMPT + expected!r}" in output, \
        output[-4000:]
    assert "Scheduled plan (8bit everywhere on the wire): measured" in output and "predicted" in output
    assert f"Logs: {tmp_path}" in output
    assert f"Plot: {tmp_path / 'demo.png'}" in output  # the loss curve and step times, drawn (plots extra)
    assert (tmp_path / "demo.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the demo measured this machine's throughput before its clients started, not one of them among the others
    assert (cache_home / "hetswarm" / "throughput.json").exists()
    client_logs = list((tmp_path / "run-scheduled").glob("*-[0-9].log"))
    assert len(client_logs) == 4 and not any("Measuring matmul throughput" in log.read_text() for log in client_logs)
    assert len(descendants.seen) >= 5  # bootstrap, 4 clients, coordinator, their DHT children and daemons
    assert descendants.alive() == []


@pytest.mark.timeout(120)
def test_ctrl_c_stops_every_process_the_demo_started(tmp_path):
    demo, descendants = start_demo(tmp_path, "--steps", "3", "--no-compare")
    try:
        deadline = time.monotonic() + 60
        while len(list(tmp_path.glob("run-*/*.log"))) < 5 and time.monotonic() < deadline:
            time.sleep(0.5)  # the bootstrap and the clients are starting
        time.sleep(3)
        demo.send_signal(signal.SIGINT)
        output, _ = demo.communicate(timeout=60)
    finally:
        demo.kill()
    assert demo.returncode != 0, output[-3000:]  # interrupted, not finished
    assert descendants.alive() == []
