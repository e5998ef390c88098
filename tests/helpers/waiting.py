"""Bounded waiting for something a swarm of processes will do."""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from hetswarm.client.local.swarm import PeerProcess

T = TypeVar("T")


def wait_until(what: str, probe: Callable[[], T | None], timeout_s: float, interval_s: float = 0.5) -> T:
    """Calls `probe` until it returns something other than None (or False); fails the test after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not (found := probe()):
        assert time.monotonic() < deadline, f"timed out after {timeout_s:.0f} s waiting for {what}"
        time.sleep(interval_s)
    return found


def pids_left(peer: PeerProcess, grace_s: float = 10.0) -> list[int]:
    """The processes of `peer` (a `hetswarm` process that has exited) still running after up to `grace_s`: torch's
    shared-memory manager leaves about 2 s after its parent, by itself."""
    deadline = time.monotonic() + grace_s
    while (alive := peer.alive_pids()) and time.monotonic() < deadline:
        time.sleep(0.2)
    return alive
