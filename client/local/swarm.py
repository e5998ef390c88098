"""A whole swarm on one machine: `hetswarm` processes on 127.0.0.1, started, watched and always reaped.

Used by `hetswarm demo` and by the integration tests. Each peer is a separate `hetswarm` process, as on a
volunteer's machine. A peer's DHT child (and its p2pd) ends soon after a SIGKILLed parent (OwnedDHT), but every
process tree is still recorded while its root is alive and ended by PID, so that a test never leaves one behind.
"""
from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from hetswarm.client.local.preimported import ForkedProcess, start_forked
from hetswarm.client.peer.addresses import LOOPBACK
from hetswarm.protocol.errors import HetswarmError

logger = logging.getLogger(__name__)

_PEER_LINE = re.compile(r"--initial-peers (\S+)")
_COORDINATOR_LINE = re.compile(r"Coordinator peer id: (\S+)")


def hetswarm_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "hetswarm.client.cli", *args]


@dataclass
class PeerProcess:
    """One `hetswarm` process and the log file that holds its output."""

    name: str
    process: subprocess.Popen | ForkedProcess
    log_path: Path
    tree: dict[int, psutil.Process] = field(default_factory=dict)
    """Descendants seen so far; psutil.Process checks creation time, so a recycled PID is never signalled."""

    def output(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def remember_tree(self) -> None:
        """Records the PIDs of this process's descendants (its DHT child and p2pd) while they are reachable."""
        try:
            children = psutil.Process(self.process.pid).children(recursive=True)
            self.tree.update({child.pid: child for child in children})
        except psutil.NoSuchProcess:
            pass

    def wait_for(self, pattern: re.Pattern, timeout_s: float) -> re.Match:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if match := pattern.search(self.output()):
                self.remember_tree()
                return match
            if self.process.poll() is not None:
                break
            time.sleep(0.2)
        raise HetswarmError(f"{self.name} did not print {pattern.pattern!r} within {timeout_s:.0f} s; its log:\n"
                            + self.output()[-3000:])

    def signal(self, sig: signal.Signals) -> None:
        self.remember_tree()
        if self.process.poll() is None:
            self.process.send_signal(sig)

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGINT (leave cleanly), then SIGKILL on whatever of the tree is left after the grace period."""
        stop_together([self], grace_s)

    def kill(self) -> None:
        """SIGKILL the process and every descendant recorded, by PID."""
        self.remember_tree()
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        for child in self.tree.values():
            try:
                child.kill()
            except psutil.NoSuchProcess:
                pass
        _, alive = psutil.wait_procs(list(self.tree.values()), timeout=5)
        if alive:
            logger.warning(f"{self.name}: processes {[p.pid for p in alive]} survived SIGKILL")

    def alive_pids(self) -> list[int]:
        """PIDs of this peer's processes that still run (zombies count as gone)."""
        alive = [] if self.process.poll() is not None else [self.process.pid]
        for pid, child in self.tree.items():
            try:
                if child.is_running() and child.status() != psutil.STATUS_ZOMBIE:
                    alive.append(pid)
            except psutil.NoSuchProcess:
                pass
        return alive


def stop_together(peers: list[PeerProcess], grace_s: float = 10.0) -> None:
    """SIGINT to every peer at once (each leaves cleanly, in parallel), then SIGKILL on whatever of their trees is
    left after the one grace period."""
    for peer in peers:
        peer.signal(signal.SIGINT)
    deadline = time.monotonic() + grace_s
    for peer in peers:
        try:
            peer.process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            logger.warning(f"{peer.name} did not leave within {grace_s:.0f} s; killing it")
        peer.kill()


class LocalSwarm:
    """Starts a bootstrap node and clients as separate processes; `close()` (or the context) reaps them all.

    With `preimported`, each process is forked from a server that imported torch and hivemind once
    (client/local/preimported.py) instead of started as a new interpreter: the test suite's swarms start sooner.
    """

    def __init__(self, swarm: str = "local", *, workdir: Path | None = None, preimported: bool = False):
        self.swarm = swarm
        self.preimported = preimported
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="hetswarm-local-"))
        self.peers: list[PeerProcess] = []
        self.initial_peers: str | None = None
        self.coordinator_id: str | None = None
        """Peer id of the coordinator started by start_coordinator; snapshots show its assignment."""

    def __enter__(self) -> LocalSwarm:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def start(self, name: str, *args: str, env: dict[str, str] | None = None) -> PeerProcess:
        """`hetswarm ARGS` as a process logging to WORKDIR/NAME.log; `env` adds to our environment."""
        log_path = self.workdir / f"{name}.log"
        env = dict(os.environ, PYTHONUNBUFFERED="1", COLUMNS="240", **(env or {}))  # log lines unwrapped
        if self.preimported:
            process = start_forked(args, log_path, env)
        else:
            with open(log_path, "wb") as log:
                process = subprocess.Popen(hetswarm_command(*args), stdout=log, stderr=subprocess.STDOUT,
                                           stdin=subprocess.DEVNULL, env=env)
        peer = PeerProcess(name, process, log_path)
        self.peers.append(peer)
        return peer

    def start_bootstrap(self, timeout_s: float = 60.0) -> PeerProcess:
        peer = self.start("bootstrap", "bootstrap", "--host-maddrs", LOOPBACK, "--swarm", self.swarm)
        self.initial_peers = peer.wait_for(_PEER_LINE, timeout_s).group(1)
        return peer

    def start_coordinator(self, name: str = "coordinator", *args: str, timeout_s: float = 60.0) -> PeerProcess:
        """`hetswarm coordinator` as the swarm's first node (its identity kept in the workdir); `args` are its
        options (--model, --dp, --pp, --min-peers, ...)."""
        peer = self.start(name, "coordinator", "--new-swarm", "--host-maddrs", LOOPBACK, "--swarm", self.swarm,
                          "--identity-path", str(self.workdir / f"{name}.key"), *args)
        self.initial_peers = peer.wait_for(_PEER_LINE, timeout_s).group(1)
        self.coordinator_id = peer.wait_for(_COORDINATOR_LINE, timeout_s).group(1)
        return peer

    def start_client(self, name: str, *args: str, env: dict[str, str] | None = None) -> PeerProcess:
        if self.initial_peers is None:
            raise HetswarmError("start the bootstrap node or the coordinator first")
        return self.start(name, "join", "--initial-peers", self.initial_peers, "--host-maddrs", LOOPBACK,
                          "--swarm", self.swarm, "--public-name", name,
                          "--identity-path", str(self.workdir / f"{name}.key"), *args, env=env)

    def snapshot(self, timeout_s: float = 60.0) -> dict[str, Any]:
        """One `hetswarm monitor --once --json` snapshot, taken by a separate read-only process."""
        pinned = ("--coordinator", self.coordinator_id) if self.coordinator_id else ()
        args = ("monitor", "--initial-peers", self.initial_peers, "--swarm", self.swarm, "--json", *pinned)
        returncode, stdout, stderr = self._run_once(args, timeout_s)
        if returncode != 0:
            raise HetswarmError(f"monitor failed ({returncode}): {stderr[-2000:]}")
        return json.loads(stdout)

    def _run_once(self, args: tuple[str, ...], timeout_s: float) -> tuple[int, str, str]:
        """`hetswarm ARGS` to its end: its exit code, stdout and stderr."""
        if not self.preimported:
            result = subprocess.run(hetswarm_command(*args), capture_output=True, text=True, timeout=timeout_s,
                                    stdin=subprocess.DEVNULL)
            return result.returncode, result.stdout, result.stderr
        handle, name = tempfile.mkstemp(prefix=f"{args[0]}-", suffix=".out", dir=self.workdir)
        os.close(handle)
        out, err = Path(name), Path(name).with_suffix(".err")
        process = start_forked(args, out, dict(os.environ), stderr_path=err)
        try:
            returncode = process.wait(timeout_s)
        finally:
            process.kill()
        text = out.read_text(errors="replace"), err.read_text(errors="replace")
        out.unlink()
        err.unlink()
        return returncode, *text

    def poll(self, done: Callable[[dict[str, Any]], bool], timeout_s: float, interval_s: float = 1.0) -> dict[str, Any]:
        """Snapshots until `done(snapshot)` holds or the time is up; the last snapshot is returned either way."""
        deadline = time.monotonic() + timeout_s
        snapshot = self.snapshot()
        while not done(snapshot) and time.monotonic() < deadline:
            time.sleep(interval_s)
            snapshot = self.snapshot()
        return snapshot

    def close(self) -> None:
        """Stops the later peers together, then the first (the bootstrap node or coordinator they reach the swarm
        through), so that every client still has it while it leaves."""
        stop_together(self.peers[1:])
        stop_together(self.peers[:1])
