"""Shared fixtures: every child process a test starts is reaped, even when the test fails."""
from __future__ import annotations

import logging

import psutil
import pytest


def reap_children(timeout_s: float = 5.0) -> list[int]:
    """Terminates, then kills, every descendant of this process (hivemind's DHT outlives a killed parent)."""
    me = psutil.Process()
    # torch's shared-memory manager (hivemind sets the file_system sharing strategy) serves this process until it
    # exits; killing it first makes the interpreter abort at exit with "Broken pipe".
    children = [child for child in me.children(recursive=True)
                if not (child.ppid() == me.pid and _name(child) == "torch_shm_manager")]
    for child in children:
        try:
            child.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(children, timeout=timeout_s)
    for child in alive:
        try:
            child.kill()
        except psutil.NoSuchProcess:
            pass
    return [child.pid for child in children]


def _name(process: psutil.Process) -> str:
    try:
        return process.name()
    except psutil.NoSuchProcess:
        return ""


@pytest.fixture(scope="session", autouse=True)
def _reap_leftover_children():
    yield
    reap_children()


@pytest.fixture
def hetswarm_logger_restored():
    """Commands run in-process configure the `hetswarm` logger (a handler, no propagation); later tests get it
    back as it was, so that their caplog still sees hetswarm's records."""
    logger = logging.getLogger("hetswarm")
    saved = logger.handlers[:], logger.level, logger.propagate
    yield
    logger.handlers[:], logger.level, logger.propagate = saved
