"""`hetswarm` processes forked from a server that imported torch, hivemind and the other libraries once.

A `hetswarm` process spends about 2 s of CPU importing torch and hivemind before it does anything; the test suite
starts dozens of them on a 2-core machine. Forked from a multiprocessing 'forkserver' that preloaded those modules,
a process only imports hetswarm itself. The server holds no thread or event loop, so each child is as clean as a
new interpreter and may fork hivemind's DHT process before starting threads (docs/hivemind.md, pitfall 3). Each
child runs what `python -m hetswarm.client.cli` runs, with its output in its log file and its own environment.

LocalSwarm uses the real entry point unless told otherwise (`LocalSwarm(..., preimported=True)`): the demo and the
benchmarks run it, and so do the tests of the demo, of orphaned processes, of the CLI's errors and logging, and of
`hetswarm doctor` and `hetswarm token`.
"""
from __future__ import annotations

import atexit
import multiprocessing
import os
import runpy
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from hetswarm.client.peer.process_env import prepare_process_environment

__all__ = ["PRELOAD", "SERVER", "ForkedProcess", "start_forked"]

PRELOAD = ("torch", "hivemind", "numpy", "scipy", "pydantic", "typer", "rich", "aiohttp", "prometheus_client")
"""Third-party modules only: hetswarm reads some of its environment when a module is imported (the console's width,
a test-only fault), and each child must read its own. A child imports this package, and what it imports, before it
sets its environment (`_run`): those modules read theirs when called (hardware.default_cache_path)."""
prepare_process_environment()  # the server inherits it when it starts, before its preload imports hivemind
SERVER = multiprocessing.get_context("forkserver")
"""Starts on its first child. One per process: the test helpers fork their training processes from it too."""
SERVER.set_forkserver_preload(list(PRELOAD))


class ForkedProcess:
    """The part of subprocess.Popen that LocalSwarm and its callers use, for a child of the forkserver."""

    def __init__(self, process: multiprocessing.Process) -> None:
        self._process = process

    @property
    def pid(self) -> int:
        return self._process.pid

    def poll(self) -> int | None:
        return self._process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        if self._process.exitcode is None:
            raise subprocess.TimeoutExpired(f"hetswarm (pid {self.pid})", timeout)
        return self._process.exitcode

    def send_signal(self, sig: signal.Signals) -> None:
        if self._process.exitcode is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self._process.kill()


def start_forked(args: Sequence[str], log_path: Path, env: dict[str, str], *,
                 stderr_path: Path | None = None) -> ForkedProcess:
    """`hetswarm ARGS` forked from the server, writing to `log_path` (made anew; stderr too unless `stderr_path`
    is given), with exactly `env`."""
    for path in (log_path, stderr_path or log_path):
        path.write_bytes(b"")
    process = SERVER.Process(target=_run, args=(list(args), str(log_path), str(stderr_path or log_path), dict(env)),
                             daemon=False)
    process.start()
    return ForkedProcess(process)


def _run(args: list[str], stdout_path: str, stderr_path: str, env: dict[str, str]) -> None:
    """In the child: stdin from /dev/null, stdout and stderr into their files, then what `python -m` would run."""
    for path, flags, fd in ((os.devnull, os.O_RDONLY, 0), (stdout_path, os.O_WRONLY | os.O_APPEND, 1),
                            (stderr_path, os.O_WRONLY | os.O_APPEND, 2)):
        opened = os.open(path, flags)
        os.dup2(opened, fd)
        os.close(opened)
    sys.stdout.reconfigure(line_buffering=True)  # a Popen'd child gets PYTHONUNBUFFERED; this one is already running
    sys.stderr.reconfigure(line_buffering=True)
    os.environ.clear()
    os.environ.update(env)
    sys.argv = ["hetswarm", *args]
    try:
        runpy.run_module("hetswarm.client.cli", run_name="__main__", alter_sys=True)
    finally:
        atexit._run_exitfuncs()  # a forkserver child leaves through os._exit, which runs none
