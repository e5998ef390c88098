"""What a swarm of volunteers standing by costs this machine, process by process, once it has measured its links.

A bootstrap node and N `hetswarm join` clients as separate processes on 127.0.0.1 (links emulated from the
world-wide scenario, as the demo's), pinned to a coordinator that never starts: every client stands by, polls for
its plan, reads the records, heartbeats and probes, as the 16 standbys of a 32-client demo do. Once every record is
in view and the first round of measurement is in (protocol/measurement_policy.py: expected_links), the CPU time and
the proportional memory (PSS) of every process of the swarm are sampled over a window, by role: the client, its DHT
process (hivemind runs the node in a forked child), their p2p daemons and torch's shared-memory manager (none since
client/peer/process_env.py). The CPU a standby takes decides how many clients one machine holds
(benchmarks/demo_scale.py).

Writes the "standby-swarm" section of benchmarks/RESULTS.md.

    python benchmarks/standby_swarm.py [--clients 16] [--window 60] [--label "..."] [--section standby-swarm]
                                       [--preimported]
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import multiprocessing.forkserver
import os
import time

import psutil
from results import command_line, revision, write_section  # benchmarks/ is on sys.path when run as a script

from hetswarm.client.local.demo import DemoConfig, DemoWatch
from hetswarm.client.local.swarm import LocalSwarm, PeerProcess
from hetswarm.client.peer.addresses import LOOPBACK
from hetswarm.client.peer.hivemind_compat import load_identity
from hetswarm.client.peer.node import NodeConfig, identity_for, start_dht_for_process
from hetswarm.protocol.identity import peer_id_of
from hetswarm.protocol.measurement_policy import expected_links
from hetswarm.protocol.record_store import SwarmRecords

SETUP = __doc__.split("\n\n")[1]
ROLES = ("client", "client's DHT process", "p2p daemon", "torch_shm_manager", "bootstrap node", "preloading server")


def role_of(process: psutil.Process, root: psutil.Process, is_bootstrap: bool) -> str:
    """Which of ROLES a process of one peer's tree (`root`, the peer's own process) is."""
    if is_bootstrap:
        return "bootstrap node"
    if process.pid == root.pid:
        return "client"
    return {"p2pd": "p2p daemon", "torch_shm_manager": "torch_shm_manager"}.get(process.name(),
                                                                                "client's DHT process")


async def wait_for_view(records: SwarmRecords, clients: int, timeout_s: float) -> int:
    """Waits until every client's record is read with the first round of links in; the links measured then."""
    started, wanted, watch = time.monotonic(), expected_links(clients), DemoWatch(records, coordinator_id="")
    while time.monotonic() - started < timeout_s:
        await watch.refresh()
        if len(watch.peers) >= clients and watch.measured[0] >= wanted:
            return watch.measured[0]
        await asyncio.sleep(2.0)
    raise TimeoutError(f"{clients} clients did not come up and measure {wanted} links within {timeout_s:.0f} s")


def preloading_server() -> psutil.Process | None:
    """The server the clients were forked from (LocalSwarm(preimported=True)), if one runs."""
    pid = multiprocessing.forkserver._forkserver._forkserver_pid
    return psutil.Process(pid) if pid is not None else None


def tree(peer: PeerProcess) -> list[psutil.Process]:
    """A peer's process and its descendants (its DHT process, its p2p daemon); none once it is gone."""
    try:
        root = psutil.Process(peer.process.pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def sample(swarm: LocalSwarm, window_s: float) -> dict[str, tuple[int, float, float]]:
    """Per role: (processes, CPU seconds over the window, summed PSS in bytes at its end), over the swarm's
    processes and their descendants (not this benchmark's own DHT node)."""
    processes = {}
    if (process := preloading_server()) is not None:  # --preimported
        processes[process] = ("preloading server", sum(process.cpu_times()[:2]))
    for peer in swarm.peers:
        if not (processes_of := tree(peer)):
            continue
        for process in processes_of:
            try:
                times = process.cpu_times()
            except psutil.NoSuchProcess:
                continue
            processes[process] = (role_of(process, processes_of[0], peer.name == "bootstrap"),
                                  times.user + times.system)
    time.sleep(window_s)
    found = collections.defaultdict(lambda: [0, 0.0, 0.0])
    for process, (role, before) in processes.items():
        try:
            times, pss = process.cpu_times(), process.memory_full_info().pss
        except psutil.NoSuchProcess:
            continue
        row = found[role]
        row[0], row[1], row[2] = row[0] + 1, row[1] + times.user + times.system - before, row[2] + pss
    return {role: tuple(row) for role, row in found.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--window", type=float, default=60.0, help="seconds of sampling, once the view is full")
    parser.add_argument("--start-timeout", type=float, default=600.0)
    parser.add_argument("--label", default="", help="what this run measures, for its heading")
    parser.add_argument("--section", default="standby-swarm", help="the RESULTS.md section it writes")
    parser.add_argument("--preimported", action="store_true",
                        help="fork the clients from one server that imported torch and hivemind (as the tests do: "
                             "client/local/preimported.py), so that they share its pages")
    args = parser.parse_args()
    config = DemoConfig(clients=args.clients)
    load_before = os.getloadavg()[0]
    with LocalSwarm("standby", preimported=args.preimported) as swarm:
        swarm.start_bootstrap()
        coordinator_id = peer_id_of(load_identity(swarm.workdir / "coordinator.key").get_public_key())
        started = time.monotonic()
        for index, (name, region) in enumerate(config.sites()):
            swarm.start_client(name, *config.client_args(index, region, coordinator_id))
        node_config = NodeConfig(swarm=swarm.swarm, initial_peers=(swarm.initial_peers,),
                                 host_maddrs=(LOOPBACK,), client_mode=True)
        dht = start_dht_for_process(node_config, identity_for(node_config))
        try:
            links = asyncio.run(wait_for_view(SwarmRecords(dht, swarm.swarm), args.clients, args.start_timeout))
            view_s = time.monotonic() - started
            by_role = sample(swarm, args.window)
            load = os.getloadavg()[0]
        finally:
            dht.shutdown()
    total_cpu = sum(cpu for _, cpu, _ in by_role.values())
    rows = [f"| {role} | {by_role[role][0]} | {100 * by_role[role][1] / args.window:.1f} % | "
            f"{100 * by_role[role][1] / args.window / max(args.clients, 1):.2f} % | "
            f"{by_role[role][2] / 2**20 / by_role[role][0]:.0f} MB |" for role in ROLES if role in by_role]
    # the clients' processes, and the preloading server's (--preimported), whose pages they share
    per_client_pss = sum(pss for role, (_, _, pss) in by_role.items() if role != "bootstrap node") / args.clients
    markdown = "\n".join([
        f"## A standing-by swarm of {args.clients} clients{': ' + args.label if args.label else ''}",
        "",
        f"Command: `{command_line()}` at {revision()} on the project's {os.cpu_count()}-core machine. "
        f"{' '.join(SETUP.split())}",
        "",
        f"Every record in view with {links} links measured after {view_s:.0f} s; then over {args.window:.0f} s: "
        f"**{100 * total_cpu / args.window:.0f} % of one core in all, {100 * total_cpu / args.window / args.clients:.1f} % "
        f"per client**; {per_client_pss / 2**20:.0f} MB PSS per client (its processes together); load average "
        f"{load_before:.1f} before the start, {load:.1f} at the end.",
        "",
        "| role | processes | CPU, of one core | per client | PSS each |",
        "|---|---|---|---|---|",
        *rows,
    ])
    print(markdown)
    write_section(args.section, markdown)


if __name__ == "__main__":
    main()
