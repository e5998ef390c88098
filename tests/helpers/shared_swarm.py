"""One read-only swarm for the tests that only observe one: metrics scrapes, the web monitor, `hetswarm doctor`.

A coordinator (the tiny model, 2 stages × 1 pipeline) and two clients train on 127.0.0.1, each serving Prometheus
metrics on a free port. The tests that use it may read it, scrape it, dial it and watch it with processes of their
own, but not change it: after each such test the guard checks that the plan's version and its members are still
the ones it started with, and fails that test if not (tests/conftest.py). Tests that kill, restart, attack or roll
back a swarm keep their own.

The swarm starts with the first test that asks for it and ends after the last one (conftest.py keeps those tests
together), so that its training does not load the rest of the run.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from hetswarm.client.local.swarm import LocalSwarm, PeerProcess

SWARM = "observed"
CLIENTS = ("alice", "bob")
TTL_S = "10"
COORDINATOR_ARGS = ("--model", "tiny", "--dp", "1", "--pp", "2", "--min-peers", str(len(CLIENTS)), "--ttl", TTL_S,
                    "--debounce", "1", "--measure-wait", "20", "--time-budget", "1", "--reconsider", "3600",
                    "--payback-steps", "0", "--metrics-port", "0")
CLIENT_ARGS = ("--ttl", TTL_S, "--seed", "0", "--torch-threads", "1", "--metrics-port", "0")
METRICS_LINE = re.compile(r"Serving Prometheus metrics at (http://127\.0\.0\.1:\d+/metrics)")


@dataclass
class ObservedSwarm:
    """The running swarm, its processes by name, and the plan the guard holds it to."""

    swarm: LocalSwarm
    peers: dict[str, PeerProcess]
    metrics_urls: dict[str, str]
    plan: tuple[int, frozenset[str]] | None = field(default=None)
    """(version, members) of the first plan every client followed."""

    @classmethod
    def start(cls, workdir: Path) -> ObservedSwarm:
        swarm = LocalSwarm(SWARM, workdir=workdir, preimported=True)
        try:
            peers = {"coordinator": swarm.start_coordinator("coordinator", *COORDINATOR_ARGS)}
            peers |= {name: swarm.start_client(name, "--coordinator", swarm.coordinator_id, *CLIENT_ARGS)
                      for name in CLIENTS}
            urls = {name: peer.wait_for(METRICS_LINE, timeout_s=60).group(1) for name, peer in peers.items()}
            observed = cls(swarm, peers, urls)
            snapshot = swarm.poll(everyone_follows, timeout_s=150, interval_s=1.0)
            assert everyone_follows(snapshot), f"the observed swarm never settled: {snapshot}"
            observed.plan = plan_of(snapshot)
            return observed
        except BaseException:
            swarm.close()
            raise

    def changes(self) -> str | None:
        """What a test changed of the swarm (its plan's version or members, a process that ended), or None."""
        ended = [name for name, peer in self.peers.items() if peer.process.poll() is not None]
        if ended:
            return f"processes of the observed swarm ended: {ended}"
        now = plan_of(self.swarm.snapshot())
        return None if now == self.plan else f"the observed swarm's plan went from {self.plan} to {now}"

    def close(self) -> None:
        self.swarm.close()


def plan_of(snapshot: dict) -> tuple[int, frozenset[str]] | None:
    assignment = snapshot["assignment"]
    if assignment is None:
        return None
    return assignment["version"], frozenset(peer["peer_id"] for row in assignment["grid"] for peer in row)


def everyone_follows(snapshot: dict) -> bool:
    """Both clients listed, following the coordinator's plan, which places them both."""
    plan = plan_of(snapshot)
    peers = [p for p in snapshot["peers"] if p["state"] != "leaving"]
    return (plan is not None and len(plan[1]) == len(CLIENTS) == len(peers)
            and all(p["assignment_version"] == plan[0] for p in peers))
