"""What the monitor shows: a snapshot of the swarm's records, as JSON for scripts or rich tables for people."""
from __future__ import annotations

import itertools
from typing import Any

import hivemind
from hivemind.utils import get_dht_time
from rich.console import Group
from rich.table import Table

from hetswarm.protocol.keys import ASSIGNMENT_FIELD, PEERS_FIELD, PROGRESS_FIELD
from hetswarm.protocol.record_store import read_records
from hetswarm.protocol.records import Assignment, PeerRecord, Progress


def short_id(peer_id: str) -> str:
    return "…" + peer_id[-6:]


async def read_snapshot(dht: hivemind.DHT, swarm: str) -> dict[str, Any]:
    """Peers, their measured links and the counts, as plain data (the shape `--json` prints)."""
    now = get_dht_time()
    records = await read_records(dht, swarm, PEERS_FIELD, PeerRecord)
    progress = await read_records(dht, swarm, PROGRESS_FIELD, Progress)
    assignments = await read_records(dht, swarm, ASSIGNMENT_FIELD, Assignment)
    peers = [
        {
            "peer_id": r.peer_id, "short_id": short_id(r.peer_id), "name": r.public_name, "site": r.site,
            "device": r.hardware.device, "device_name": r.hardware.device_name, "tflops": r.hardware.tflops,
            "dtype": r.hardware.dtype, "memory_gib": r.hardware.memory_gib, "state": r.state,
            "last_heard_s": max(0.0, now - r.updated_at), "version": r.version,
        }
        for r in sorted(records.values(), key=lambda r: (r.public_name or "", r.peer_id))
    ]
    links = [
        {"src": src, "dst": dst, "latency_ms": m.latency_ms, "bandwidth_mbps": m.bandwidth_mbps,
         "age_s": max(0.0, now - m.measured_at), "samples": m.samples}
        for src, record in records.items() for dst, m in record.links.items() if dst in records
    ]
    measured = {frozenset((link["src"], link["dst"])) for link in links}
    pairs = [frozenset(pair) for pair in itertools.combinations(records, 2)]
    states = [r.state for r in records.values()]
    return {
        "swarm": swarm,
        "peers": peers,
        "links": links,
        "counts": {
            "peers": len(peers),
            "by_state": {state: states.count(state) for state in sorted(set(states))},
            "pairs": len(pairs),
            "pairs_measured": sum(pair in measured for pair in pairs),
        },
        "assignments": {coordinator: a.dict() for coordinator, a in assignments.items()},
        "progress": [p.dict() for p in progress.values()],
    }


def peers_table(snapshot: dict[str, Any]) -> Table:
    table = Table(title=f"swarm {snapshot['swarm']!r}: {snapshot['counts']['peers']} peers")
    for column in ("peer", "name", "site", "device", "TFLOPS", "memory GiB", "state", "last heard"):
        table.add_column(column, justify="right" if column in ("TFLOPS", "memory GiB", "last heard") else "left")
    for p in snapshot["peers"]:
        table.add_row(p["short_id"], p["name"] or "", p["site"] or "", p["device_name"], f"{p['tflops']:.2f}",
                      f"{p['memory_gib']:.1f}", p["state"], f"{p['last_heard_s']:.0f} s ago")
    return table


def links_table(snapshot: dict[str, Any]) -> Table:
    """Latency / bandwidth from each row's peer to each column's peer; `?` where nobody measured."""
    ids = [p["peer_id"] for p in snapshot["peers"]]
    measured = {(link["src"], link["dst"]): link for link in snapshot["links"]}
    counts = snapshot["counts"]
    table = Table(title=f"links, ms / Mbit/s ({counts['pairs_measured']} of {counts['pairs']} pairs measured)")
    table.add_column("from \\ to")
    for peer in ids:
        table.add_column(short_id(peer), justify="right")
    for src in ids:
        cells = []
        for dst in ids:
            link = measured.get((src, dst))
            cells.append("—" if src == dst else "?" if link is None else
                         f"{link['latency_ms']:.0f} / {link['bandwidth_mbps']:.0f}")
        table.add_row(short_id(src), *cells)
    return table


def render(snapshot: dict[str, Any]) -> Group:
    return Group(peers_table(snapshot), links_table(snapshot))
