"""Does a swarm of 64 volunteers come to a plan within minutes on one machine, each measuring at most k links?

A bootstrap node, a coordinator (`--min-peers N`, one DP × PP plan: the other peers stand by) and N `hetswarm join`
clients started one every few seconds, each a peer of its own with its DHT node and p2p daemon on 127.0.0.1, links
emulated from the world-wide scenario as the demo's (client/local/demo.py) but with records that live the product's
60 s. The clients are forked from one server that imported torch and hivemind (client/local/preimported.py), so that
they share its pages: the issue's "many volunteers may share a process", at the level of memory pages. A read-only
DHT node of this process reads the peer records every few seconds, timing each read: when every client's record is in
view, when the coordinator's first plan is, and the size and links of each record. Once the plan is out, the CPU time
and the memory (PSS) of every client's process tree (its client, DHT process and p2p daemon) are sampled over a
window, a standby's memory with its share of the preloading server. The logs give the estimator's error and any peer
the coordinator lost.

Writes the "swarm-scale" section of benchmarks/RESULTS.md.

    python benchmarks/swarm_scale.py [--peers 64] [--dp 4] [--pp 4] [--join-every 2] [--window 60]
                                     [--start-timeout 900] [--time-budget 5]
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import math
import os
import statistics
import time
from dataclasses import dataclass, field

import psutil
from demo_scale import TreeMemory  # benchmarks/ is on sys.path when run as a script
from hivemind.utils import get_dht_time
from results import command_line, reference_work_s, revision, write_section
from standby_swarm import preloading_server, role_of, tree
from swarm_log_lines import coordinator_phases, departures_counted, estimated_links, planned_out, unstored_records

from hetswarm.client.local.demo import DemoConfig
from hetswarm.client.local.swarm import LocalSwarm, PeerProcess
from hetswarm.client.peer.addresses import LOOPBACK
from hetswarm.client.peer.hivemind_compat import load_identity
from hetswarm.client.peer.node import NodeConfig, identity_for, start_dht_for_process
from hetswarm.protocol.identity import peer_id_of
from hetswarm.protocol.keys import PEERS_FIELD
from hetswarm.protocol.measurement_policy import DEFAULT_MAX_LINKS
from hetswarm.protocol.record_store import SwarmRecords, stored_bytes
from hetswarm.protocol.records import Assignment, PeerRecord
from hetswarm.protocol.remembered_peers import RememberedPeers

SETUP = __doc__.split("\n\n")[1]
TTL_S = 60.0
READ_EVERY_S = 5.0
MAX_RECORD_BYTES_WANTED = 8 * 1024
MAX_STANDBY_TREE_BYTES = 250 * 2**20


@dataclass
class ScaleWatch:
    """What this process's read-only node saw of the swarm, from the last client's start on."""

    records: SwarmRecords
    coordinator_id: str
    clients: frozenset[str]
    """The clients' public names."""
    since: float
    """time.monotonic() when the last client was started."""
    read_s: list[float] = field(default_factory=list)
    timeouts: int = 0
    full_view_s: float | None = None
    first_plan_s: float | None = None
    plan: Assignment | None = None
    peers: dict[str, PeerRecord] = field(default_factory=dict)
    biggest_record: int = 0
    most_links: int = 0
    remembered: RememberedPeers = field(default_factory=RememberedPeers)
    ended: list[str] = field(default_factory=list)
    """Clients whose process ended before the plan (their logs say why)."""

    async def until_plan(self, timeout_s: float, processes: dict[str, PeerProcess]) -> None:
        """Reads every READ_EVERY_S until the coordinator's plan is out, or a client's process ended (the plan waits
        for all of them); TimeoutError past `timeout_s`."""
        async with asyncio.timeout(timeout_s):
            while self.plan is None and not self.ended:
                await self._read_once()
                self.ended = sorted(name for name, peer in processes.items() if peer.process.poll() is not None)
                await asyncio.sleep(READ_EVERY_S)

    async def _read_once(self) -> None:
        started = time.monotonic()
        try:
            read = await self.records.read_expiring(PEERS_FIELD)
            self.read_s.append(time.monotonic() - started)
            self.plan = (await self.records.assignments(self.coordinator_id)).get(self.coordinator_id)
        except TimeoutError:
            self.timeouts += 1
            return
        view = self.remembered.merge(read, get_dht_time())
        self.peers = {p: r for p, r in view.items() if r.public_name in self.clients and r.state != "leaving"}
        for record, _ in read.values():
            self.biggest_record = max(self.biggest_record, stored_bytes(record.dict()))
            self.most_links = max(self.most_links, len(record.links))
        now = time.monotonic() - self.since
        if self.full_view_s is None and len(self.peers) == len(self.clients):
            self.full_view_s = now
        if self.first_plan_s is None and self.plan is not None:
            self.first_plan_s = now


@dataclass(frozen=True)
class TreeSample:
    """One peer's process tree over the sampling window."""

    cpu_s: float
    pss: int
    """Summed PSS at the end, in bytes."""
    cpu_s_by_role: dict[str, float]
    """CPU seconds of its client, its DHT process and its p2p daemon (standby_swarm.ROLES)."""


def sample_trees(peers: dict[str, PeerProcess], window_s: float) -> dict[str, TreeSample]:
    """Per peer: the CPU seconds its tree used over the window, by role, and its summed PSS at the end."""
    before = {name: {process: sum(process.cpu_times()[:2]) for process in tree(peer)} for name, peer in peers.items()}
    time.sleep(window_s)
    found = {}
    for name, processes in before.items():
        pss, by_role = 0, collections.Counter()
        root = next(iter(processes), None)  # tree() lists the peer's own process first
        for process, start in processes.items():
            try:
                by_role[role_of(process, root, is_bootstrap=False)] += sum(process.cpu_times()[:2]) - start
                pss += process.memory_full_info().pss
            except psutil.NoSuchProcess:
                continue
        found[name] = TreeSample(sum(by_role.values()), pss, dict(by_role))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peers", type=int, default=64)
    parser.add_argument("--dp", type=int, default=4)
    parser.add_argument("--pp", type=int, default=4)
    parser.add_argument("--window", type=float, default=60.0, help="seconds of CPU and memory sampling after the plan")
    parser.add_argument("--start-timeout", type=float, default=900.0, help="from the last join to the first plan")
    parser.add_argument("--join-every", type=float, default=2.0,
                        help="seconds between two clients' starts: volunteers come one by one, not all in one second")
    parser.add_argument("--time-budget", type=float, default=5.0, help="the coordinator's search budget, seconds")
    args = parser.parse_args()
    config = DemoConfig(clients=args.peers, dp=args.dp, stages=args.pp, ttl_s=TTL_S)
    reference_s = reference_work_s()
    names = {name: region for name, region in config.sites()}
    memory = TreeMemory()
    with LocalSwarm("scale", preimported=True) as swarm:
        swarm.start_bootstrap()
        coordinator_key = swarm.workdir / "coordinator.key"
        coordinator_id = peer_id_of(load_identity(coordinator_key).get_public_key())
        swarm.start("coordinator", "coordinator", "--initial-peers", swarm.initial_peers, "--host-maddrs", LOOPBACK,
                    "--swarm", swarm.swarm, "--identity-path", str(coordinator_key), "--model", config.model,
                    "--dp", str(args.dp), "--pp", str(args.pp), "--min-peers", str(args.peers),
                    "--time-budget", str(args.time_budget), "--ttl", str(TTL_S), "--reconsider", "3600",
                    "--compression", config.compression)
        node_config = NodeConfig(swarm=swarm.swarm, initial_peers=(swarm.initial_peers,), host_maddrs=(LOOPBACK,),
                                 client_mode=True)
        dht = start_dht_for_process(node_config, identity_for(node_config))
        first_join = time.monotonic()
        clients = {}
        for index, (name, region) in enumerate(names.items()):
            if index:
                time.sleep(args.join_every)
            clients[name] = swarm.start_client(name, *config.client_args(index, region, coordinator_id))
        watch = ScaleWatch(SwarmRecords(dht, swarm.swarm), coordinator_id, frozenset(names), time.monotonic())
        last_join = time.time()
        joining_s = watch.since - first_join
        try:
            try:
                asyncio.run(watch.until_plan(args.start_timeout, clients))
            except TimeoutError:  # measured all the same: how far the swarm got
                print(f"no plan within {args.start_timeout:.0f} s of the last join; logs: {swarm.workdir}", flush=True)
            trees = sample_trees(clients, args.window)
            roles = watch.plan.roles if watch.plan is not None else {}
            placed = {record.public_name for peer, record in watch.peers.items() if peer in roles}
            server = preloading_server()
            share = server.memory_full_info().pss / len(names) if server is not None else 0
        finally:
            dht.shutdown()
            memory.stop()
        coordinator = (swarm.workdir / "coordinator.log").read_text(errors="replace")
        unstored = unstored_records(swarm.workdir)
    mib = 2**20
    links = [len(r.links) for r in watch.peers.values()]
    standbys = [trees[name] for name in names if name not in placed]
    standby_pss = sorted(sample.pss + share for sample in standbys)
    cpu_share = {group: statistics.median(sample.cpu_s for sample in members) / args.window if members else math.nan
                 for group, members in (("standby", standbys), ("placed", [trees[name] for name in placed]))}
    standby_roles = ", ".join(
        f"{role} {100 * statistics.median(sample.cpu_s_by_role.get(role, 0.0) for sample in standbys) / args.window:.1f}"
        for role in ("client", "client's DHT process", "p2p daemon")) if standbys else "none"
    rows = [
        f"| peers, plan | {args.peers}, {args.pp} stages × {args.dp} pipelines, {len(standbys)} standing by |",
        f"| clients started in | {joining_s:.0f} s |",
        f"| clients whose process ended before the plan | {', '.join(watch.ended) or 'none'} |",
        f"| **last join → every record in view** | {_seconds(watch.full_view_s)} |",
        f"| **last join → first plan** (wanted ≤ 180 s) | {_seconds(watch.first_plan_s)} |",
        f"| the coordinator's log, from the last join (to the second) | " + ", ".join(
            f"{phase} {_seconds(at)}" for phase, at in coordinator_phases(coordinator, args.peers, last_join).items())
        + " |",
        f"| **links measured per peer** (k = {DEFAULT_MAX_LINKS}) | at most {max(links)}, mean "
        f"{statistics.mean(links):.1f}; the most any record read listed: {watch.most_links} |",
        f"| **largest record as stored** (wanted ≤ {MAX_RECORD_BYTES_WANTED} bytes) | "
        f"{watch.biggest_record:,} bytes |",
        f"| DHT read of every record: median, max ({len(watch.read_s)} reads, {watch.timeouts} timed out) | "
        f"{statistics.median(watch.read_s):.2f} s, {max(watch.read_s):.2f} s |",
        f"| estimated links the plan was priced on | {estimated_links(coordinator)} |",
        f"| **a standby's process tree, PSS** (wanted ≤ {MAX_STANDBY_TREE_BYTES // mib} MB) | median "
        f"{statistics.median(standby_pss) / mib:.0f} MB, max {standby_pss[-1] / mib:.0f} MB |",
        f"| CPU of a peer's tree over {args.window:.0f} s after the plan, median | standby "
        f"{100 * cpu_share['standby']:.1f} % of a core ({standby_roles}), placed (training) "
        f"{100 * cpu_share['placed']:.1f} % |",
        f"| peak memory of the process tree, PSS | {memory.peak_pss / 2**30:.1f} GiB, "
        f"{memory.peak_processes} processes |",
        f"| coordinator counted a live client as left | {departures_counted(coordinator)} |",
        f"| peers reported unreachable and planned out | {', '.join(planned_out(coordinator)) or 'none'} |",
        f"| client records no DHT node accepted (log lines) | {unstored} |",
        f"| highest load average (1 min) | {memory.peak_load:.0f} on {os.cpu_count()} cores |",
        f"| this machine's speed: benchmarks/results.py's reference work before the run | {reference_s:.3f} s |",
    ]
    markdown = "\n".join([
        f"## {args.peers} real peers on one machine: from the last join to the first plan",
        "",
        f"Command: `{command_line()}` at {revision()} on the project's {os.cpu_count()}-core, "
        f"{psutil.virtual_memory().total / 2**30:.0f} GiB machine. {' '.join(SETUP.split())}",
        "",
        "| measure | value |",
        "|---|---|",
        *rows,
    ])
    print(markdown)
    write_section("swarm-scale", markdown)


def _seconds(value: float | None) -> str:
    return "never" if value is None else f"{value:.0f} s"


if __name__ == "__main__":
    main()
