"""A joining node whose only initial peer is too busy to answer its first ping starts again instead of dying
(client/peer/node.py: BOOTSTRAP_ATTEMPTS), on real DHT nodes: the initial peer's DHT process is stopped (SIGSTOP),
as a process of a machine at a load average of 130 is stalled, and let go when the joining node says it tries again.

The joining node runs in a process of its own, forked from the forkserver (client/local/preimported.py) as a
volunteer's is: hivemind forks its DHT process, and a fork of this test's process, which holds the threads of earlier
tests, once hung there for the whole test's time (docs/hivemind.md, pitfall 3)."""
from __future__ import annotations

import asyncio
import logging
import os
import signal
from multiprocessing import Queue
from pathlib import Path

import pytest

from hetswarm.client.local.preimported import SERVER
from hetswarm.client.peer import node as node_module
from tests.helpers.dht_nodes import peers_seen_by, start_node

pytestmark = [pytest.mark.swarm, pytest.mark.timeout(120)]

JOIN_TIMEOUT_S = 90.0
"""The joining node's three tries with 1-s pauses take about 7 s here when idle."""


class _ResumeOnRetry(logging.Handler):
    """Lets the stopped initial peer go on when the joining node logs that it tries again."""

    def __init__(self, pid: int) -> None:
        super().__init__(logging.WARNING)
        self.pid, self.retries = pid, 0

    def emit(self, record: logging.LogRecord) -> None:
        if "trying again" in record.getMessage():
            self.retries += 1
            os.kill(self.pid, signal.SIGCONT)


def _join(stopped_pid: int, maddrs: list[str], identity_path: Path, results: Queue) -> None:
    """In the joining process: starts its node through the stopped peer, then reports its tries and a read."""
    node_module.BOOTSTRAP_PAUSE_S = 1.0
    resume = _ResumeOnRetry(stopped_pid)
    node_module.logger.addHandler(resume)
    second, _ = start_node("late", identity_path, maddrs)
    try:
        results.put((resume.retries, asyncio.run(peers_seen_by(second, "late"))))
    finally:
        second.shutdown()


def test_a_node_whose_initial_peer_answers_too_late_starts_on_the_next_try(tmp_path):
    first, _ = start_node("late", tmp_path / "a.key")
    results = SERVER.Queue()
    try:
        maddrs = [str(m) for m in first.get_visible_maddrs()]
        joiner = SERVER.Process(target=_join, args=(first.pid, maddrs, tmp_path / "b.key", results))
        os.kill(first.pid, signal.SIGSTOP)
        joiner.start()
        retries, seen = results.get(timeout=JOIN_TIMEOUT_S)
        joiner.join(timeout=30)
        assert retries == 1
        assert seen == {}  # the node serves: a read of it completes
        assert joiner.exitcode == 0
    finally:
        os.kill(first.pid, signal.SIGCONT)
        first.shutdown()
