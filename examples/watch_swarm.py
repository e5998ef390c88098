"""Watch a swarm from Python: a read-only, client-mode DHT node that prints one line per snapshot.

The library under `hetswarm monitor`, as hivemind's examples/albert/run_training_monitor.py watches its swarm:
join the DHT without accepting connections, read the swarm's signed records (peers, assignments, progress) into
a `SwarmSnapshot` every --refresh seconds, and summarise it. It runs for --duration seconds (less with
--until-peers, once that many peers are present) and always shuts its DHT node (a child process with its own
p2pd) down on the way out.

    python examples/watch_swarm.py --initial-peers /ip4/127.0.0.1/tcp/31337/p2p/Qm... --duration 30
    python examples/watch_swarm.py --initial-peers ... --duration 60 --until-peers 4   # wait for a swarm to fill

Each line: seconds since start, the peers by name, how many are in each state, measured links out of the pairs
of present peers, the current assignment's version, and the latest training step and loss anyone reported.
"""
from __future__ import annotations

import argparse
import asyncio
import time
from collections import Counter

from hetswarm.client.monitor.snapshot import SwarmSnapshot
from hetswarm.client.peer.addresses import LOOPBACK
from hetswarm.client.peer.node import DEFAULT_SWARM, NodeConfig, identity_for, start_dht_for_process
from hetswarm.protocol.errors import HetswarmError
from hetswarm.protocol.keys import short_id
from hetswarm.protocol.record_store import SwarmRecords


def summary(snapshot: SwarmSnapshot, *, coordinator: str | None = None) -> str:
    """One line about the swarm: who is there, in which state, how much of the link graph is measured, and
    where training stands."""
    names = sorted(record.public_name or short_id(record.peer_id) for record in snapshot.peers.values())
    states = Counter(record.state for record in snapshot.peers.values())
    measured, pairs = snapshot.links_measured()
    assignment = snapshot.assignment(coordinator)
    latest = max(snapshot.progress.values(), key=lambda p: (p.step, p.updated_at), default=None)
    with_loss = [p for p in snapshot.progress.values() if p.loss is not None]  # only last stages compute a loss
    last_loss = max(with_loss, key=lambda p: (p.step, p.updated_at), default=None)
    return (f"peers={len(names)} [{', '.join(names)}] "
            f"states={','.join(f'{state}:{n}' for state, n in sorted(states.items())) or '-'} "
            f"links={measured}/{pairs} "
            f"assignment={assignment.version if assignment else '-'} "
            f"step={latest.step if latest else '-'} "
            f"loss={f'{last_loss.loss:.4f}' if last_loss else '-'}")


def present_peers(snapshot: SwarmSnapshot) -> int:
    """Peers whose record is live and not saying goodbye."""
    return sum(record.state != "leaving" for record in snapshot.peers.values())


async def watch(records: SwarmRecords, *, duration_s: float, refresh_s: float, coordinator: str | None,
                until_peers: int | None = None) -> SwarmSnapshot | None:
    """Prints a line every `refresh_s` until `duration_s` has passed, or sooner once `until_peers` peers are
    present (not leaving); returns the last snapshot read, None if every read timed out.

    Each read has the records' own deadline, so the loop ends at most one read timeout after `duration_s`."""
    started = time.monotonic()
    last: SwarmSnapshot | None = None
    while True:
        elapsed = time.monotonic() - started
        try:
            snapshot = await SwarmSnapshot.read(records)
        except TimeoutError:  # a slow or unreachable swarm: say so and try again next time
            print(f"t={elapsed:6.1f}s the records could not be read within {records.timeout_s:.0f} s", flush=True)
        else:
            last = snapshot
            print(f"t={elapsed:6.1f}s {summary(snapshot, coordinator=coordinator)}", flush=True)
            if until_peers is not None and present_peers(snapshot) >= until_peers:
                return last
        remaining_s = duration_s - (time.monotonic() - started)
        if remaining_s <= 0:
            return last
        await asyncio.sleep(min(refresh_s, remaining_s))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--initial-peers", nargs="+", required=True, help="multiaddrs of peers in the swarm")
    parser.add_argument("--swarm", default=DEFAULT_SWARM, help="swarm name (its DHT keys)")
    parser.add_argument("--coordinator", default=None, help="peer id of the coordinator whose assignment to show")
    parser.add_argument("--refresh", type=float, default=2.0, help="seconds between snapshots")
    parser.add_argument("--duration", type=float, default=30.0, help="seconds to watch before exiting")
    parser.add_argument("--until-peers", type=int, default=None,
                        help="stop early once this many peers are present (for scripts that wait for a swarm)")
    parser.add_argument("--read-timeout", type=float, default=10.0, help="deadline of each DHT read, seconds")
    parser.add_argument("--host-maddrs", nargs="+", default=[LOOPBACK],
                        help="where the node listens (client mode accepts no inbound connections anyway)")
    args = parser.parse_args(argv)
    if not (args.refresh > 0 and args.duration >= 0 and args.read_timeout > 0):
        parser.error("--refresh and --read-timeout must be positive and --duration non-negative")

    try:
        config = NodeConfig(swarm=args.swarm, initial_peers=tuple(args.initial_peers),
                            host_maddrs=tuple(args.host_maddrs), client_mode=True)
        # start_dht, with Ctrl+C kept from the DHT child so that `finally` below can shut it down cleanly;
        # it forks, so it runs before any thread of ours
        dht = start_dht_for_process(config, identity_for(config))
    except HetswarmError as e:  # a bad multiaddr or an unreachable swarm
        parser.exit(1, f"error: {e}\n")
    try:
        records = SwarmRecords(dht, config.swarm, timeout_s=args.read_timeout)
        last = asyncio.run(watch(records, duration_s=args.duration, refresh_s=args.refresh,
                                  coordinator=args.coordinator, until_peers=args.until_peers))
    finally:
        dht.shutdown()
    if last is None:
        print("no snapshot could be read", flush=True)
        return 1
    if args.until_peers is not None and present_peers(last) < args.until_peers:
        print(f"only {present_peers(last)} of {args.until_peers} peers appeared within {args.duration:.0f} s", flush=True)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
