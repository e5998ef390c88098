"""Bounded waiting for something a swarm of processes will do."""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(what: str, probe: Callable[[], T | None], timeout_s: float, interval_s: float = 0.5) -> T:
    """Calls `probe` until it returns something other than None (or False); fails the test after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not (found := probe()):
        assert time.monotonic() < deadline, f"timed out after {timeout_s:.0f} s waiting for {what}"
        time.sleep(interval_s)
    return found
