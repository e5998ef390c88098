"""Does training survive churn: steps lost, seconds from each leave or join to training again, bytes handed off,
and the loss against a run without churn?

A coordinator (tiny model, 2 pipelines × 2 stages, checkpoints every 10 steps) and 6 clients (4 placed, 2 standbys)
as separate processes on 127.0.0.1, their links emulated from the world-wide scenario at the demo's bandwidth
scale, each client with a checkpoint folder. Every `--every` seconds one event, alternating: a leave (SIGKILL of a
random placed client) and a join (a new client at a random region). This process watches the assignments and
Progress records through its own read-only DHT node, and reads the clients' logs at the end:
- seconds to training again: the longest time, from the event to the next one, that the highest applied step did
  not grow (a leave stops training until a plan without the dead peer trains; a join re-plans too);
- steps lost: for each new plan, the steps applied under the plans before it that it trains again (its start step
  is the `Assignment N: ..., from step S` line of its clients' logs);
- bytes handed off: the `handoff_bytes` of each peer's first record under each plan.
Then the same swarm without churn or emulation trains to the last step the churned run reached, and the losses of
that step are compared (hand-offs are exact, so they should be equal). Bounded: `--minutes` of churn, and the run
gives up after `--timeout` seconds. Writes the "churn" section of benchmarks/RESULTS.md.

    python benchmarks/churn.py [--minutes 20] [--every 60] [--seed 0] [--timeout 2400]
"""
from __future__ import annotations

import argparse
import asyncio
import random
import re
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

from results import command_line, write_section  # benchmarks/ is on sys.path when run as a script

from hetswarm.client.local.demo import REGIONS
from hetswarm.client.local.swarm import LocalSwarm, PeerProcess
from hetswarm.client.peer.addresses import LOOPBACK
from hetswarm.client.peer.hivemind_compat import load_identity
from hetswarm.client.peer.node import NodeConfig, identity_for, start_dht_for_process
from hetswarm.protocol.identity import peer_id_of
from hetswarm.protocol.record_store import SwarmRecords
from hetswarm.protocol.records import Assignment, Progress

SWARM = "churn"
COORDINATOR_ARGS = ("--model", "tiny", "--dp", "2", "--pp", "2", "--debounce", "1", "--time-budget", "1",
                    "--reconsider", "3600", "--checkpoint-every", "10", "--ttl", "20")
BANDWIDTH_SCALE = 0.005
"""The demo's (client/local/demo.py): a tiny model's traffic then outweighs its compute, as a real model's would."""
QUIET_S = 60.0
"""After the last event, the swarm is watched this long without events, so that it can recover from it."""
_STARTED = re.compile(r"Assignment (\d+): stage \d+ of pipeline \d+, from step (\d+)")
_LOSS = re.compile(r"step (\d+): loss ([0-9.]+)")


@dataclass
class Event:
    kind: str  # "leave" or "join"
    peer: str
    at: float  # time.monotonic()
    version: int
    step: int
    recovered_s: float | None = None


@dataclass
class Watch:
    """What the observer saw: every (peer, version, step, health) record once, the plans by version, and when the
    highest applied step grew."""

    records: dict[tuple[str, int, int, str], tuple[float, Progress]] = field(default_factory=dict)
    plans: dict[int, Assignment] = field(default_factory=dict)
    advances: list[tuple[float, int]] = field(default_factory=list)

    def plan(self) -> Assignment | None:
        return self.plans[max(self.plans)] if self.plans else None

    def step(self) -> int:
        return max((r.step for _, r in self.records.values() if r.health == "training"), default=-1)


async def observe(records: SwarmRecords, coordinator: str, watch: Watch) -> None:
    try:
        progress, assignments = await records.progress(), await records.assignments()
    except TimeoutError:
        return
    if (plan := assignments.get(coordinator)) is not None:
        watch.plans.setdefault(plan.version, plan)
    for peer, record in progress.items():
        watch.records.setdefault((peer, record.assignment_version, record.step, record.health), (time.monotonic(),
                                                                                                record))
    if not watch.advances or watch.step() > watch.advances[-1][1]:
        watch.advances.append((time.monotonic(), watch.step()))


def start_client(swarm: LocalSwarm, name: str, region: str) -> tuple[PeerProcess, str]:
    process = swarm.start_client(name, "--coordinator", swarm.coordinator_id, "--emulate", "worldwide", "--site",
                                 region, "--bandwidth-scale", str(BANDWIDTH_SCALE), "--torch-threads", "1",
                                 "--ttl", "20", "--checkpoint-dir", str(swarm.workdir / f"ckpt-{name}"))
    return process, peer_id_of(load_identity(swarm.workdir / f"{name}.key").get_public_key())


async def churn(swarm: LocalSwarm, records: SwarmRecords, args: argparse.Namespace) -> tuple[Watch, list[Event]]:
    rng, watch, events = random.Random(args.seed), Watch(), []
    clients = dict(start_client(swarm, f"c{i}", REGIONS[i % len(REGIONS)])[::-1] for i in range(6))
    deadline = time.monotonic() + args.timeout
    while watch.step() < 3 and time.monotonic() < deadline:  # the first plan trains
        await observe(records, swarm.coordinator_id, watch)
        await asyncio.sleep(0.5)
    end, next_event, joined = time.monotonic() + 60 * args.minutes, time.monotonic(), 6
    while time.monotonic() < min(end + QUIET_S, deadline):
        await observe(records, swarm.coordinator_id, watch)
        if time.monotonic() >= next_event and time.monotonic() < end and (plan := watch.plan()) is not None:
            if len(events) % 2 == 0:
                peer = rng.choice(sorted(p for p in plan.roles if p in clients))
                await asyncio.to_thread(clients.pop(peer).kill)
                events.append(Event("leave", peer, time.monotonic(), plan.version, watch.step()))
            else:
                process, peer = start_client(swarm, f"c{joined}", rng.choice(REGIONS))
                clients[peer], joined = process, joined + 1
                events.append(Event("join", peer, time.monotonic(), plan.version, watch.step()))
            print(f"{events[-1].kind} {peer[-6:]} at step {events[-1].step}", flush=True)
            next_event = time.monotonic() + args.every
        await asyncio.sleep(0.5)
    ends = [e.at for e in events[1:]] + [time.monotonic()]
    for event, until in zip(events, ends):
        event.recovered_s = longest_stall(event.at, until, watch.advances)
    return watch, events


def longest_stall(since: float, until: float, advances: list[tuple[float, int]]) -> float | None:
    """The longest time the highest applied step did not grow between an event and the next: from the event to
    training again, and any later stall the event's re-plan caused; None when it never grew again."""
    times = [t for t, _ in advances if since < t <= until]
    if not times:
        return None
    return max(b - a for a, b in zip([since, *times], times))


def plan_starts(workdir: Path) -> dict[int, int]:
    """The step each plan version really started at, from the clients' logs (they agree; the lowest is kept)."""
    starts: dict[int, int] = {}
    for log in workdir.glob("*.log"):
        for version, step in _STARTED.findall(log.read_text(errors="replace")):
            starts[int(version)] = min(int(step), starts.get(int(version), int(step)))
    return starts


def logged_losses(workdir: Path) -> dict[int, list[float]]:
    losses: dict[int, list[float]] = {}
    for log in workdir.glob("*.log"):
        for step, loss in _LOSS.findall(log.read_text(errors="replace")):
            losses.setdefault(int(step), []).append(float(loss))
    return losses


def steps_lost(watch: Watch, starts: dict[int, int]) -> dict[int, int]:
    """Per plan version: the steps applied under earlier versions that it trains again."""
    lost = {}
    for version, start in sorted(starts.items()):
        before = [r.step for _, r in watch.records.values() if r.health == "training" and r.assignment_version < version]
        lost[version] = max(0, max(before, default=-1) + 1 - start)
    return lost


def baseline_losses(step: int, timeout_s: float) -> dict[int, list[float]]:
    """A swarm without churn or emulation trained to `step`; its logged losses by step."""
    with LocalSwarm(SWARM + "-calm") as swarm:
        swarm.start_coordinator("coordinator", "--min-peers", "4", *COORDINATOR_ARGS)
        for i in range(4):
            swarm.start_client(f"calm{i}", "--coordinator", swarm.coordinator_id, "--torch-threads", "1",
                               "--max-steps", str(step + 1))
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and len(logged_losses(swarm.workdir).get(step, [])) < 2:
            time.sleep(2)
        return logged_losses(swarm.workdir)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=20.0)
    parser.add_argument("--every", type=float, default=60.0, help="seconds between events")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=2400.0, help="give up after this many seconds")
    args = parser.parse_args()
    started = time.monotonic()
    with LocalSwarm(SWARM) as swarm:
        print(f"logs: {swarm.workdir}", flush=True)
        swarm.start_coordinator("coordinator", "--min-peers", "6", "--measure-wait", "120", *COORDINATOR_ARGS)
        config = NodeConfig(swarm=SWARM, initial_peers=(swarm.initial_peers,), host_maddrs=(LOOPBACK,),
                            client_mode=True)
        dht = start_dht_for_process(config, identity_for(config))
        try:
            watch, events = asyncio.run(churn(swarm, SwarmRecords(dht, SWARM), args))
        finally:
            dht.shutdown()
        starts, losses = plan_starts(swarm.workdir), logged_losses(swarm.workdir)
    final = max(step for step, values in losses.items() if len(values) >= 2)
    calm = baseline_losses(final, timeout_s=max(60.0, args.timeout - (time.monotonic() - started)))
    report(watch, events, starts, losses, calm, final=final, args=args)


def report(watch: Watch, events: list[Event], starts: dict[int, int], losses: dict, calm: dict, *, final: int,
           args: argparse.Namespace) -> None:
    lost = steps_lost(watch, starts)
    first = {}
    for _, record in watch.records.values():
        first.setdefault((record.peer_id, record.assignment_version), record)
    origins = [r.state_origin for r in first.values() if r.state_origin is not None]
    handed = [r.handoff_bytes for r in first.values() if r.state_origin in ("handed off", "checkpoint")]
    rows, summary = [], []
    for kind in ("leave", "join"):
        times = [e.recovered_s for e in events if e.kind == kind and e.recovered_s is not None]
        missing = sum(e.kind == kind and e.recovered_s is None for e in events)
        median = statistics.median(times) if times else float("nan")
        summary.append(f"| {kind} | {sum(e.kind == kind for e in events)} | {median:.1f} | "
                       f"{max(times, default=float('nan')):.1f} | {missing} |")
    for e in events[:30]:
        after = f"{e.recovered_s:.1f}" if e.recovered_s is not None else "never"
        rows.append(f"| {e.kind} | …{e.peer[-6:]} | {e.step} | {after} |")
    churned, calm_loss = sorted(set(losses.get(final, []))), sorted(set(calm.get(final, [])))
    difference = max((abs(a - b) for a, b in zip(churned, calm_loss)), default=float("nan"))
    total_lost = sum(lost.values())
    markdown = f"""## Churn: a leave or a join every {args.every:.0f} s for {args.minutes:.0f} min

Command: `{command_line()}` on the project's 2-core machine (shared with other jobs).

Coordinator and 6 clients (2 × 2 placed, 2 standbys) on 127.0.0.1, world-wide links emulated at bandwidth × {BANDWIDTH_SCALE},
tiny model, checkpoints every 10 steps; {len(events)} events, alternately the SIGKILL of a placed client and a new client.

| event | count | median s to training again (longest stall after it) | max s | never recovered |
|---|---|---|---|---|
{chr(10).join(summary)}

- Plan versions: {len(watch.plans)}; steps trained again because of a change of plan: **{total_lost}** (target 0);
  per version: {', '.join(f'v{v}: {n}' for v, n in sorted(lost.items()) if n) or 'none'}.
- Where each plan's stage state came from (first record of each peer under each plan): {', '.join(f'{o}: {origins.count(o)}' for o in sorted(set(origins)))}.
- Bytes handed off: {sum(handed)} in {len(handed)} hand-offs ({statistics.median(handed) if handed else 0:.0f} median).
- Loss at step {final}: {', '.join(f'{x:.6f}' for x in churned)} with churn, {', '.join(f'{x:.6f}' for x in calm_loss)} without
  (per pipeline); largest difference {difference:.2e} (target ≤ 1e-3: {'met' if difference <= 1e-3 else 'MISSED'}).

| event | peer | step at event | s to training again |
|---|---|---|---|
{chr(10).join(rows)}
"""
    print(markdown)
    write_section("churn", markdown)


if __name__ == "__main__":
    main()
