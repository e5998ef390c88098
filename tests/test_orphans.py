"""A SIGKILLed `hetswarm` process takes its whole process tree with it: its DHT process, that process's p2pd and
torch's shm manager, which the DHT process keeps open. Before OwnedDHT, all three kept running (and the DHT kept
serving the swarm) until someone killed them by PID (docs/hivemind.md, pitfall 5).
"""
from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import re
import signal
import time

import psutil
import pytest

from hetswarm.client.local.swarm import LocalSwarm, PeerProcess
from hetswarm.client.peer.addresses import LOOPBACK
from hetswarm.client.peer.node import ORPHAN_GRACE_S, OwnedDHT
from tests.helpers.dht_nodes import start_node

pytestmark = [pytest.mark.swarm, pytest.mark.timeout(120)]

GONE_WITHIN_S = 10.0
_JOINED = re.compile(r"Joined swarm")


def running(processes: list[psutil.Process]) -> list[str]:
    """Those still running, as 'name(pid)'; zombies count as gone (they await only their reaper)."""
    alive = []
    for process in processes:
        try:
            if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                alive.append(f"{process.name()}({process.pid})")
        except psutil.NoSuchProcess:
            pass
    return alive


def kill_and_watch_tree(peer: PeerProcess) -> tuple[list[str], list[str]]:
    """SIGKILLs the peer's own PID only; returns the names of its descendants as recorded before, and those still
    running after GONE_WITHIN_S."""
    descendants = psutil.Process(peer.process.pid).children(recursive=True)
    tree = [process.name() for process in descendants]
    peer.remember_tree()  # so that LocalSwarm.close() reaps them by PID should this test fail
    peer.process.kill()
    peer.process.wait(timeout=5)
    deadline = time.monotonic() + GONE_WITHIN_S
    while running(descendants) and time.monotonic() < deadline:
        time.sleep(0.2)
    return tree, running(descendants)


def test_a_sigkilled_client_takes_its_dht_process_and_p2pd_with_it(tmp_path):
    with LocalSwarm("orphans", workdir=tmp_path) as swarm:
        bootstrap = swarm.start_bootstrap()
        client = swarm.start_client("client")
        client.wait_for(_JOINED, timeout_s=90)
        tree, alive = kill_and_watch_tree(client)
        assert "p2pd" in tree and len(tree) >= 2, tree  # and the DHT process
        assert "torch_shm_manager" not in tree, tree  # 57 MB PSS a peer (client/peer/process_env.py)
        assert alive == [], f"still running {GONE_WITHIN_S:.0f} s after SIGKILL: {alive}"
        assert bootstrap.process.poll() is None  # only the killed peer's tree went


def test_a_sigkilled_coordinator_takes_its_dht_process_and_p2pd_with_it(tmp_path):
    with LocalSwarm("orphans", workdir=tmp_path) as swarm:
        coordinator = swarm.start_coordinator("coordinator", "--model", "tiny", "--min-peers", "2")
        tree, alive = kill_and_watch_tree(coordinator)
        assert "p2pd" in tree and len(tree) >= 2, tree
        assert alive == [], f"still running {GONE_WITHIN_S:.0f} s after SIGKILL: {alive}"


def test_a_dht_shut_down_normally_leaves_no_p2pd_behind(tmp_path):
    dht, _ = start_node("orphans", tmp_path / "node.key")
    tree = psutil.Process(dht.pid).children(recursive=True)
    assert [process.name() for process in tree] == ["p2pd"]
    dht.shutdown()
    assert dht.exitcode == 0  # it left by itself, not by hivemind's terminate() after the grace period
    _, alive = psutil.wait_procs(tree, timeout=5)
    assert running(alive) == []


class HangingShutdownDHT(OwnedDHT):
    """Fault: the clean shutdown never finishes, so an orphaned DHT process must fall back to ending p2pd by PID
    and exiting by itself."""

    async def _shutdown(self) -> None:
        await asyncio.sleep(3600)


def _own_a_hanging_dht(pids: mp.Queue) -> None:
    """In a forked owner process: start the faulty DHT, report its PID, and wait to be SIGKILLed."""
    dht = HangingShutdownDHT(host_maddrs=[LOOPBACK], start=False)
    dht.run_in_background(await_ready=True, timeout=60)
    pids.put(dht.pid)
    time.sleep(120)
    os._exit(0)


def test_an_orphaned_dht_whose_clean_shutdown_hangs_still_ends_with_its_p2pd():
    context = mp.get_context("fork")
    pids = context.Queue()
    owner = context.Process(target=_own_a_hanging_dht, args=(pids,))  # not daemonic: daemons may not fork
    owner.start()
    try:
        dht_process = psutil.Process(pids.get(timeout=60))
        tree = [dht_process] + dht_process.children(recursive=True)
        assert [p.name() for p in tree[1:]] == ["p2pd"]
        os.kill(owner.pid, signal.SIGKILL)
        owner.join(timeout=5)
        deadline = time.monotonic() + ORPHAN_GRACE_S + GONE_WITHIN_S
        while running(tree) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert running(tree) == []
    finally:
        if owner.is_alive():
            owner.kill()
