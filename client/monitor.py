"""What the monitor shows: a snapshot of the swarm's records, as JSON for scripts or rich tables for people.

Beside the peers and their links it shows the current assignment (the pinned coordinator's, or the newest version
anyone published): the stage × replica grid with peer names and sites, each pipeline's chain, the bottleneck link
priced on the links as the coordinator sees them (unmeasured ones estimated and flagged), the predicted step time.
"""
from __future__ import annotations

import itertools
from typing import Any

import hivemind
import numpy as np
from hivemind.utils import get_dht_time
from rich.console import Group
from rich.table import Table

from hetswarm.coordinator.cost_model import PaperCostModel, Payloads
from hetswarm.coordinator.model_config import ModelConfig
from hetswarm.coordinator.plan import cost_plan
from hetswarm.coordinator.swarm_view import SwarmView, build_view, trainable_peers
from hetswarm.protocol.keys import ASSIGNMENT_FIELD, PEERS_FIELD, PROGRESS_FIELD
from hetswarm.protocol.record_store import read_records
from hetswarm.protocol.records import Assignment, PeerRecord, Progress


def short_id(peer_id: str) -> str:
    return "…" + peer_id[-6:]


async def read_snapshot(dht: hivemind.DHT, swarm: str, *, coordinator: str | None = None) -> dict[str, Any]:
    """Peers, their links, the counts and the current assignment, as plain data (the shape `--json` prints)."""
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
            "assignment_version": r.assignment_version, "role": r.role.dict() if r.role else None,
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
    view = build_view(records) if trainable_peers(records) else None
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
        "estimated_links": [] if view is None else [
            {"src": view.peer_ids[i], "dst": view.peer_ids[j], "method": how,
             "latency_ms": float(view.network.latency_ms[i, j]),
             "bandwidth_mbps": float(view.network.bandwidth_gbps[i, j]) * 1000}
            for (i, j), how in sorted(view.estimated.items())],
        "assignments": {signer: a.dict() for signer, a in assignments.items()},
        "assignment": _current_assignment(assignments, records, view, coordinator),
        "progress": [p.dict() for p in progress.values()],
    }


def _current_assignment(assignments: dict[str, Assignment], records: dict[str, PeerRecord], view: SwarmView | None,
                        coordinator: str | None) -> dict[str, Any] | None:
    """The assignment to show, with names, sites and its bottleneck link filled in from the peers' records."""
    if coordinator is not None:
        assignment = assignments.get(coordinator)
    else:
        assignment = max(assignments.values(), key=lambda a: (a.version, a.issued_at), default=None)
    if assignment is None:
        return None

    def who(peer: str) -> dict[str, Any]:
        record = records.get(peer)
        return {"peer_id": peer, "name": record.public_name if record else None, "site": record.site if record else None,
                "alive": record is not None and record.state != "leaving"}

    placed = [peer for chain in assignment.pipelines for peer in chain]
    return {
        "version": assignment.version, "coordinator_id": assignment.coordinator_id, "reason": assignment.reason,
        "d_pp": assignment.d_pp, "d_dp": assignment.d_dp, "stage_layers": assignment.stage_layers,
        "micro_batches": assignment.micro_batches, "model": assignment.model.get("name"),
        "predicted_step_s": assignment.predicted_step_s, "breakdown": assignment.breakdown,
        "grid": [[who(chain[stage]) for chain in assignment.pipelines] for stage in range(assignment.d_pp)],
        "pipelines": [[who(peer) for peer in chain] for chain in assignment.pipelines],
        "standbys": [who(p) for p in sorted(records) if p not in assignment.roles and records[p].state != "leaving"],
        "bottleneck_link": _bottleneck(assignment, view, placed, who),
        "followers": sum(r.assignment_version == assignment.version for r in records.values()),
    }


def _bottleneck(assignment: Assignment, view: SwarmView | None, placed: list[str], who) -> dict[str, Any] | None:
    """The slowest pipeline hop of the assignment on the current links; None if a placed peer has gone."""
    if assignment.d_pp < 2 or view is None or not set(placed) <= set(view.peer_ids):
        return None
    try:
        model = ModelConfig.from_dict(assignment.model)
    except (TypeError, ValueError):
        return None
    peers = view.subset(placed)
    grid = np.arange(len(placed)).reshape(assignment.d_dp, assignment.d_pp).T  # placed is pipeline-major
    payloads = Payloads.from_model(model, d_dp=assignment.d_dp, d_pp=assignment.d_pp)
    plan = cost_plan(PaperCostModel(peers.network, payloads, d_dp=assignment.d_dp, d_pp=assignment.d_pp), grid)
    a, b = plan.bottleneck.devices
    return {"stage": plan.bottleneck.stage, "pipeline": plan.bottleneck.pipeline, "time_s": plan.bottleneck.time_s,
            "src": who(placed[a]), "dst": who(placed[b]), "latency_ms": float(peers.network.latency_ms[a, b]),
            "bandwidth_mbps": float(peers.network.bandwidth_gbps[a, b]) * 1000,
            "estimated": tuple(sorted((a, b))) in peers.estimated}


def peers_table(snapshot: dict[str, Any]) -> Table:
    table = Table(title=f"swarm {snapshot['swarm']!r}: {snapshot['counts']['peers']} peers")
    for column in ("peer", "name", "site", "device", "TFLOPS", "memory GiB", "state", "role", "last heard"):
        table.add_column(column, justify="right" if column in ("TFLOPS", "memory GiB", "last heard") else "left")
    for p in snapshot["peers"]:
        table.add_row(p["short_id"], p["name"] or "", p["site"] or "", p["device_name"], f"{p['tflops']:.2f}",
                      f"{p['memory_gib']:.1f}", p["state"], _role(p), f"{p['last_heard_s']:.0f} s ago")
    return table


def _role(peer: dict[str, Any]) -> str:
    if peer["assignment_version"] is None:
        return ""
    role = peer["role"]
    where = "standby" if role is None else f"stage {role['stage']}, replica {role['replica']}"
    return f"v{peer['assignment_version']}: {where}"


def links_table(snapshot: dict[str, Any]) -> Table:
    """Latency / bandwidth from each row's peer to each column's peer; `?` where nobody measured."""
    ids = [p["peer_id"] for p in snapshot["peers"]]
    measured = {(link["src"], link["dst"]): link for link in snapshot["links"]}
    counts = snapshot["counts"]
    estimated = {frozenset((link["src"], link["dst"])): link for link in snapshot.get("estimated_links", [])}
    table = Table(title=f"links, ms / Mbit/s ({counts['pairs_measured']} of {counts['pairs']} pairs measured; "
                        "~ estimated)")
    table.add_column("from \\ to")
    for peer in ids:
        table.add_column(short_id(peer), justify="right")
    for src in ids:
        cells = []
        for dst in ids:
            link = measured.get((src, dst))
            guess = estimated.get(frozenset((src, dst)))
            cells.append("—" if src == dst else f"{link['latency_ms']:.0f} / {link['bandwidth_mbps']:.0f}" if link
                         else f"~{guess['latency_ms']:.0f} / {guess['bandwidth_mbps']:.0f}" if guess else "")
        table.add_row(short_id(src), *cells)
    return table


def assignment_table(assignment: dict[str, Any]) -> Group:
    """Stage × replica grid (name and site of each peer), the pipelines' chains, the bottleneck and the prediction."""
    def label(peer: dict[str, Any]) -> str:
        text = f"{peer['name'] or short_id(peer['peer_id'])} ({peer['site'] or '?'})"
        return text if peer["alive"] else f"[red]{text} gone[/red]"

    grid = Table(title=f"assignment v{assignment['version']} ({assignment['model']}): {assignment['d_dp']} pipelines "
                       f"× {assignment['d_pp']} stages, {assignment['micro_batches']} micro-batches — "
                       f"{assignment['reason']}")
    grid.add_column("stage (layers)")
    for replica in range(assignment["d_dp"]):
        grid.add_column(f"replica {replica}")
    for stage, (row, (a, b)) in enumerate(zip(assignment["grid"], assignment["stage_layers"])):
        grid.add_row(f"{stage} [{a}, {b})", *(label(peer) for peer in row))
    lines = [f"pipeline {r}: " + " → ".join(label(peer) for peer in chain)
             for r, chain in enumerate(assignment["pipelines"])]
    if assignment["standbys"]:
        lines.append("standby: " + ", ".join(label(peer) for peer in assignment["standbys"]))
    if (link := assignment["bottleneck_link"]) is not None:
        lines.append(f"bottleneck link: stage {link['stage']}→{link['stage'] + 1} of pipeline {link['pipeline']}, "
                     f"{label(link['src'])} → {label(link['dst'])}: {link['latency_ms']:.0f} ms, "
                     f"{link['bandwidth_mbps']:.0f} Mbit/s{' (estimated)' if link['estimated'] else ''}, "
                     f"{link['time_s']:.3f} s per pass")
    parts = ", ".join(f"{k} {v:.3f}" for k, v in assignment["breakdown"].items() if k != "step_s")
    lines.append(f"predicted step {assignment['predicted_step_s']:.3f} s ({parts}); "
                 f"{assignment['followers']} peers follow this version")
    return Group(grid, *lines)


def progress_table(snapshot: dict[str, Any]) -> Table:
    """Each training peer's latest step; step time = compute + waiting, beside the plan's prediction."""
    names = {p["peer_id"]: p["name"] or p["short_id"] for p in snapshot["peers"]}
    assignment = snapshot.get("assignment")
    predicted = f", predicted {assignment['predicted_step_s']:.2f} s/step" if assignment else ""
    table = Table(title=f"training progress{predicted}")
    for column in ("peer", "plan", "step", "loss", "tokens/s", "compute s", "wait s", "step s"):
        table.add_column(column, justify="left" if column in ("peer", "plan") else "right")
    for p in sorted(snapshot["progress"], key=lambda p: names.get(p["peer_id"], p["peer_id"])):
        loss = "" if p["loss"] is None else f"{p['loss']:.3f}"
        table.add_row(names.get(p["peer_id"], short_id(p["peer_id"])), f"v{p['assignment_version']}", str(p["step"]),
                      loss, f"{p['tokens_per_s']:.0f}", f"{p['compute_s']:.2f}", f"{p['wait_s']:.2f}",
                      f"{p['compute_s'] + p['wait_s']:.2f}")
    return table


def render(snapshot: dict[str, Any]) -> Group:
    parts = [peers_table(snapshot), links_table(snapshot)]
    if snapshot.get("assignment") is not None:
        parts.append(assignment_table(snapshot["assignment"]))
    if snapshot["progress"]:
        parts.append(progress_table(snapshot))
    return Group(*parts)
