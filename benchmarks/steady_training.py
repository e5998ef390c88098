"""Does a healthy swarm keep training: steps per minute, the longest stall, retries and resyncs over 500 steps?

A coordinator and 4 clients as separate processes on 127.0.0.1 (no link emulation) train the tiny model as
2 pipelines × 2 stages with all-or-nothing steps (client/training/step_commit.py) up to `--steps`. This process
watches the Progress records through its own read-only DHT node: a stall is the longest time between two
consecutive records of one peer (an upper bound: the publisher may coalesce records of quick steps); retries and
resyncs are the counters the peers publish. Bounded: the run gives up after `--timeout` seconds. Writes the
"steady-training" section of benchmarks/RESULTS.md.

    python benchmarks/steady_training.py [--steps 500] [--timeout 1800]
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from results import command_line, write_section  # benchmarks/ is on sys.path when run as a script

from hetswarm.client.local.swarm import LocalSwarm
from hetswarm.client.peer.addresses import LOOPBACK
from hetswarm.client.peer.node import NodeConfig, identity_for, start_dht_for_process
from hetswarm.protocol.record_store import SwarmRecords
from hetswarm.protocol.records import Progress

SWARM = "steady"
CLIENTS = ("a", "b", "c", "d")


async def watch(records: SwarmRecords, coordinator: str, *, steps: int, timeout_s: float) -> dict[str, list[Progress]]:
    """Every distinct Progress record of the plan's members until each reached the last step (or time ran out)."""
    seen: dict[str, dict[tuple[int, int, str], Progress]] = {}
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            progress, assignments = await records.progress(), await records.assignments()
        except TimeoutError:
            continue
        plan = assignments.get(coordinator)
        for peer, record in progress.items():
            if plan is not None and peer in plan.roles:
                seen.setdefault(peer, {})[(record.assignment_version, record.step, record.health)] = record
        done = [max((r.step for r in found.values()), default=-1) >= steps - 1 for found in seen.values()]
        if len(done) == len(CLIENTS) and all(done):
            break
        await asyncio.sleep(0.5)
    return {peer: sorted(found.values(), key=lambda r: r.updated_at) for peer, found in seen.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--timeout", type=float, default=1800.0, help="give up after this many seconds")
    args = parser.parse_args()
    with LocalSwarm(SWARM) as swarm:
        print(f"logs: {swarm.workdir}", flush=True)
        swarm.start_coordinator("coordinator", "--model", "tiny", "--dp", "2", "--pp", "2", "--min-peers", "4",
                                "--debounce", "1", "--time-budget", "1", "--reconsider", "3600")
        for name in CLIENTS:
            swarm.start_client(name, "--coordinator", swarm.coordinator_id, "--max-steps", str(args.steps),
                               "--torch-threads", "1")
        config = NodeConfig(swarm=SWARM, initial_peers=(swarm.initial_peers,), host_maddrs=(LOOPBACK,),
                            client_mode=True)
        dht = start_dht_for_process(config, identity_for(config))
        try:
            started = time.monotonic()
            history = asyncio.run(watch(SwarmRecords(dht, SWARM), swarm.coordinator_id, steps=args.steps,
                                        timeout_s=args.timeout))
            wall_s = time.monotonic() - started
        finally:
            dht.shutdown()
    report(history, steps=args.steps, wall_s=wall_s)


def report(history: dict[str, list[Progress]], *, steps: int, wall_s: float) -> None:
    trained = {peer: [r for r in records if r.health == "training"] for peer, records in history.items()}
    reached = min((records[-1].step + 1 for records in trained.values() if records), default=0)
    spans = [(records[-1].updated_at - records[0].updated_at, records[-1].step - records[0].step)
             for records in trained.values() if len(records) >= 2]
    steps_per_min = statistics.median(60 * n / s for s, n in spans if s > 0) if spans else 0.0
    stall_s = max((b.updated_at - a.updated_at for records in history.values() for a, b in zip(records, records[1:])),
                  default=0.0)
    last = [records[-1] for records in trained.values() if records]
    retries, resyncs = sum(r.retries for r in last), sum(r.resyncs for r in last)
    troubled = sum(r.health != "training" for records in history.values() for r in records)
    versions = sorted({r.assignment_version for records in history.values() for r in records})
    markdown = f"""## Steady training: a healthy 2 × 2 swarm, {steps} steps

Command: `{command_line()}` on the project's 2-core machine (shared with other jobs), {wall_s / 60:.1f} min.

A coordinator and 4 clients on 127.0.0.1 (no emulation), tiny model, 2 pipelines × 2 stages, all-or-nothing steps.

| steps reached (every peer) | steps / min (median over peers) | longest stall (s) | retries (summed over peers: an aborted attempt counts on each) | resyncs (summed over peers) | health reports | plan versions |
|---|---|---|---|---|---|---|
| {reached} of {steps} | {steps_per_min:.0f} | {stall_s:.1f} | {retries} | {resyncs} | {troubled} | {', '.join(map(str, versions))} |

Target: no stall longer than 60 s — {'met' if stall_s <= 60 and reached == steps else 'MISSED'}.
"""
    print(markdown)
    write_section("steady-training", markdown)


if __name__ == "__main__":
    main()
