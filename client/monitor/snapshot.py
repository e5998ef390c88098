"""One typed snapshot of a swarm's records, read once for whoever watches: the monitor, the demo, scripts.

`SwarmSnapshot.to_json` is the shape `hetswarm monitor --json` prints: beside the peers and their links, the
current assignment (the pinned coordinator's, or the newest version anyone published) with the stage × replica
grid of peer names and sites, each pipeline's chain, the plan's price as its coordinator published it (the predicted
step, its breakdown, the bottleneck hop, all under the plan's wire), and the training state: the step, the newest
checkpoint that covers the model, the live replicas of each stage, and where each member's state came from. The
links the coordinator estimates rather than measured are listed beside the measured ones.
"""
from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from hivemind.utils import get_dht_time

from hetswarm.client.peer.assignment_follower import reason_to_refuse
from hetswarm.client.peer.held_out import swarm_held_out
from hetswarm.coordinator.link_estimate import describe_error
from hetswarm.coordinator.state_plan import newest_complete_checkpoint
from hetswarm.coordinator.swarm_view import build_view, trainable_peers
from hetswarm.protocol.keys import short_id
from hetswarm.protocol.record_store import SwarmRecords
from hetswarm.protocol.records import Assignment, PeerId, PeerRecord, Progress, Refusals
from hetswarm.protocol.remembered_peers import RememberedPeers
from hetswarm.protocol.units import MBPS_PER_GBPS

__all__ = ["SwarmSnapshot"]


@dataclass(frozen=True, slots=True)
class SwarmSnapshot:
    """Every valid record of a swarm at one moment, by signer."""

    swarm: str
    peers: dict[PeerId, PeerRecord]
    assignments: dict[PeerId, Assignment]
    progress: dict[PeerId, Progress]
    read_at: float
    """hivemind DHT time of the read."""
    refusals: dict[PeerId, Refusals] = field(default_factory=dict)
    """Each coordinator's list of the peers it does not plan, and why."""

    @classmethod
    async def read(cls, records: SwarmRecords, coordinator: PeerId | None = None, *,
                   remembered: RememberedPeers | None = None) -> SwarmSnapshot:
        """Reads the swarm's keys (each under the reader's deadline: TimeoutError past it), the pinned
        `coordinator`'s records kept among a flood of others' (SwarmRecords); a reader that reads again and again
        keeps the peers `remembered` until their records expire (protocol/remembered_peers.py)."""
        read_at = get_dht_time()
        peers = await remembered.read(records) if remembered is not None else await records.peers()
        return cls(swarm=records.swarm, peers=peers,
                   assignments=await records.assignments(coordinator), progress=await records.progress(),
                   read_at=read_at, refusals=await records.refusals(coordinator))

    def assignment(self, coordinator: PeerId | None = None) -> Assignment | None:
        """The pinned coordinator's assignment, or else the newest version anyone published; one no client would
        follow (assignment_follower.reason_to_refuse) is passed over, as the clients pass it over."""
        sound = {signer: a for signer, a in self.assignments.items() if reason_to_refuse(a) is None}
        if coordinator is not None:
            return sound.get(coordinator)
        return max(sound.values(), key=lambda a: (a.version, a.issued_at), default=None)

    def links_measured(self) -> tuple[int, int]:
        """(pairs of present peers with a measured link, pairs of present peers); leaving peers do not count."""
        ids = [p for p, r in self.peers.items() if r.state != "leaving"]
        measured = {frozenset((src, dst)) for src in ids for dst in self.peers[src].links if dst in ids}
        return len(measured), len(ids) * (len(ids) - 1) // 2

    def to_json(self, coordinator: PeerId | None = None) -> dict[str, Any]:
        """Peers, their links, the counts and the current assignment, as plain data (the shape `--json` prints)."""
        return _as_json(self, coordinator)


def _as_json(snapshot: SwarmSnapshot, coordinator: PeerId | None) -> dict[str, Any]:
    now, swarm, records, progress = snapshot.read_at, snapshot.swarm, snapshot.peers, snapshot.progress
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
    assignment = snapshot.assignment(coordinator)
    judge = coordinator or (assignment.coordinator_id if assignment else None)
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
             "bandwidth_mbps": float(view.network.bandwidth_gbps[i, j]) * MBPS_PER_GBPS}
            for (i, j), how in sorted(view.estimated.items())],
        "estimate_error": None if view is None or not view.estimated else describe_error(view.estimate_error),
        "assignments": {signer: a.dict() for signer, a in snapshot.assignments.items()},
        "pinned_coordinator": coordinator,
        "assignment": _current_assignment(assignment, records, progress),
        "progress": [p.dict() for p in progress.values()],
        "refused": _judged(snapshot, judge, "refused"),
        "flagged": _judged(snapshot, judge, "flagged"),
    }


def _judged(snapshot: SwarmSnapshot, coordinator: PeerId | None, kind: str) -> list[dict[str, Any]]:
    """The peers the coordinator does not plan (`refused`) or plans by what they do (`flagged`), with its reason
    and their names."""
    refusals = snapshot.refusals.get(coordinator) if coordinator is not None else None
    if refusals is None:
        return []
    return [{"peer_id": peer, "short_id": short_id(peer), "reason": reason,
             "name": snapshot.peers[peer].public_name if peer in snapshot.peers else None}
            for peer, reason in sorted(getattr(refusals, kind).items())]


def _current_assignment(assignment: Assignment | None, records: dict[str, PeerRecord],
                        progress: dict[str, Progress]) -> dict[str, Any] | None:
    """The assignment to show, with names and sites filled in from the peers' records."""
    if assignment is None:
        return None

    def who(peer: str) -> dict[str, Any]:
        record = records.get(peer)
        return {"peer_id": peer, "name": record.public_name if record else None, "site": record.site if record else None,
                "alive": record is not None and record.state != "leaving"}

    return {
        "version": assignment.version, "coordinator_id": assignment.coordinator_id, "reason": assignment.reason,
        "d_pp": assignment.d_pp, "d_dp": assignment.d_dp, "stage_layers": assignment.stage_layers,
        "micro_batches": assignment.micro_batches, "model": assignment.model.get("name"),
        "predicted_step_s": assignment.predicted_step_s, "breakdown": assignment.breakdown,
        "wire": _wire(assignment),
        "grid": [[who(chain[stage]) for chain in assignment.pipelines] for stage in range(assignment.d_pp)],
        "pipelines": [[who(peer) for peer in chain] for chain in assignment.pipelines],
        "standbys": [who(p) for p in sorted(records) if p not in assignment.roles and records[p].state != "leaving"],
        "bottleneck_link": _bottleneck(assignment, who),
        "followers": sum(r.assignment_version == assignment.version for r in records.values()),
        "training_state": _training_state(assignment, records, progress),
        "held_out": None if (held_out := swarm_held_out(assignment, progress)) is None else
        asdict(held_out) | {"corroborated": held_out.corroborated, "text": held_out.describe()},
    }


def _wire(assignment: Assignment) -> dict[str, Any] | None:
    """The plan's codecs, or None when its model config is broken (the monitor still shows the rest)."""
    try:
        return assignment.wire_format().to_dict()
    except (TypeError, ValueError):
        return None


def _training_state(assignment: Assignment, records: dict[str, PeerRecord], progress: dict[str, Progress]
                    ) -> dict[str, Any]:
    """How far the plan got, how many replicas hold each stage, the checkpoints the peers in view hold, and where
    each member's state came from (client/training/state_handoff.py)."""
    under = {p: r for p, r in progress.items() if p == r.peer_id and p in assignment.roles
             and r.assignment_version == assignment.version}
    training = {p for p, r in under.items() if r.health == "training"}
    present = {p for p, r in records.items() if r.state != "leaving"}
    try:
        complete = newest_complete_checkpoint(records, present, assignment.model_config().n_layers)
    except (TypeError, ValueError):
        complete = None
    stages = range(assignment.d_pp)
    plan = assignment.checkpoints
    return {
        "step": max((r.step for p, r in under.items() if p in training), default=None),
        "replicas": [sum(chain[s] in present for chain in assignment.pipelines) for s in stages],
        "replicas_training": [sum(chain[s] in present & training for chain in assignment.pipelines) for s in stages],
        "last_checkpoint": complete[0] if complete else None,
        "checkpoints_by_stage": [max((i.step for p in present for i in records[p].checkpoints
                                      if i.layers == list(layers)), default=None) for layers in assignment.stage_layers],
        "checkpoint_every": plan.every if plan else None,
        "checkpoint_savers": plan.savers if plan else [None] * assignment.d_pp,
        "resumed_from_checkpoint": bool(assignment.handoff and assignment.handoff.resumed_from_checkpoint),
        "seeded_layers": assignment.handoff.seeded_layers if assignment.handoff else [],
        "handoffs": [{"peer_id": p, "name": records[p].public_name if p in records else None, "origin": r.state_origin,
                      "bytes": r.handoff_bytes, "seconds": r.handoff_s}
                     for p, r in sorted(under.items()) if r.state_origin is not None],
    }


def _bottleneck(assignment: Assignment, who: Callable[[str], dict[str, Any]]) -> dict[str, Any] | None:
    """The plan's slowest hop as its coordinator priced it (protocol/records.py, BottleneckHop), with its ends."""
    hop = assignment.bottleneck
    if hop is None:
        return None
    chain = assignment.pipelines[hop.pipeline]
    return hop.dict() | {"src": who(chain[hop.stage]), "dst": who(chain[hop.stage + 1])}
