"""Reaping what a test started: every descendant of the test process, by PID (hivemind's DHT outlives a killed
parent)."""
from __future__ import annotations

import multiprocessing.forkserver
import multiprocessing.resource_tracker

import psutil

from hetswarm.client.peer.node import end_processes


def reap_children(timeout_s: float = 5.0) -> list[int]:
    """Terminates, then kills, every descendant of this process but the servers it keeps for later tests."""
    me = psutil.Process()
    children = [child for child in me.children(recursive=True) if not _kept(me, child)]
    end_processes(children, grace_s=timeout_s)
    return [child.pid for child in children]


def _kept(me: psutil.Process, child: psutil.Process) -> bool:
    """torch's shared-memory manager (hivemind sets the file_system sharing strategy in a process, such as this
    one, that imports it before hetswarm's entry points set another: client/peer/process_env.py) serves this
    process until it exits: killing it makes the interpreter abort at exit with "Broken pipe". The forkserver
    (client/local/preimported.py) starts the next test's processes; its children are reaped like any other; and
    multiprocessing's resource tracker, killed, is started again with a warning that resources may leak."""
    servers = (multiprocessing.forkserver._forkserver._forkserver_pid,
               multiprocessing.resource_tracker._resource_tracker._pid)
    try:
        return child.ppid() == me.pid and (child.name() == "torch_shm_manager" or child.pid in servers)
    except psutil.NoSuchProcess:
        return False
