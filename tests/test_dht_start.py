"""A joining node whose only initial peer is too busy to answer its first ping starts again instead of dying
(client/peer/node.py: BOOTSTRAP_ATTEMPTS), on real DHT nodes: the initial peer's DHT process is stopped (SIGSTOP),
as a process of a machine at a load average of 130 is stalled, and let go when the joining node says it tries again."""
from __future__ import annotations

import asyncio
import logging
import os
import signal

import pytest

from hetswarm.client.peer import node as node_module
from tests.helpers.dht_nodes import peers_seen_by, start_node

pytestmark = [pytest.mark.swarm, pytest.mark.timeout(120)]


class _ResumeOnRetry(logging.Handler):
    """Lets the stopped initial peer go on when the joining node logs that it tries again."""

    def __init__(self, pid: int) -> None:
        super().__init__(logging.WARNING)
        self.pid, self.retries = pid, 0

    def emit(self, record: logging.LogRecord) -> None:
        if "trying again" in record.getMessage():
            self.retries += 1
            os.kill(self.pid, signal.SIGCONT)


def test_a_node_whose_initial_peer_answers_too_late_starts_on_the_next_try(tmp_path, monkeypatch):
    monkeypatch.setattr(node_module, "BOOTSTRAP_PAUSE_S", 1.0)
    first, _ = start_node("late", tmp_path / "a.key")
    resume = _ResumeOnRetry(first.pid)
    node_module.logger.addHandler(resume)
    try:
        maddrs = [str(m) for m in first.get_visible_maddrs()]
        os.kill(first.pid, signal.SIGSTOP)
        second, _ = start_node("late", tmp_path / "b.key", maddrs)
        try:
            assert resume.retries == 1
            assert asyncio.run(peers_seen_by(second, "late")) == {}  # the node serves: a read of it completes
        finally:
            second.shutdown()
    finally:
        node_module.logger.removeHandler(resume)
        os.kill(first.pid, signal.SIGCONT)
        first.shutdown()
