"""The signed record clients follow, built from a priced proposal: who runs what, how, and the plan's one price.

The price is the coordinator's: the live model's predicted step and its breakdown, and the slowest pipeline hop, all
for the bytes the plan's wire sends, on the links the coordinator saw when it published the plan. Monitors show it
as published (client/monitor/snapshot.py) rather than price the plan again with a model of their own.
"""
from __future__ import annotations

import numpy as np
from hivemind.utils import get_dht_time

from hetswarm.coordinator.planner import Proposal
from hetswarm.protocol.limits import MAX_BANDWIDTH_MBPS, MAX_LATENCY_MS, MAX_SECONDS
from hetswarm.protocol.records import (
    Aggregation,
    Assignment,
    BottleneckHop,
    CheckpointPlan,
    Handoff,
    PeerRole,
)
from hetswarm.protocol.units import MBPS_PER_GBPS

__all__ = ["bottleneck_hop", "build_assignment"]


def build_assignment(proposal: Proposal, *, coordinator_id: str, version: int, reason: str, step: int,
                     handoff: Handoff | None = None, checkpoints: CheckpointPlan | None = None,
                     aggregation: Aggregation = "mean", eval_every: int = 0) -> Assignment:
    """The signed record clients follow, from a priced proposal."""
    d_pp, d_dp = proposal.plan.grid.shape
    pipelines = proposal.pipelines
    return Assignment(
        coordinator_id=coordinator_id,
        version=version,
        model=proposal.model.to_dict(),
        d_pp=d_pp,
        d_dp=d_dp,
        stage_layers=[[a, b] for a, b in proposal.execution.stage_layers],
        roles={peer: PeerRole(stage=stage, replica=replica)
               for replica, chain in enumerate(pipelines) for stage, peer in enumerate(chain)},
        pipelines=pipelines,
        predicted_step_s=float(proposal.live.total_s),
        breakdown=proposal.live.to_dict() | {"paper_cost_s": float(proposal.plan.cost_s)},
        micro_batches=proposal.execution.micro_batches,
        recompute=proposal.execution.recompute,
        schedule=proposal.execution.schedule,
        step=step,
        reason=reason[:256],
        issued_at=get_dht_time(),
        handoff=handoff,
        checkpoints=checkpoints,
        aggregation=aggregation,
        wire=proposal.wire.to_dict(),
        eval_every=eval_every,
        bottleneck=bottleneck_hop(proposal),
    )


def bottleneck_hop(proposal: Proposal) -> BottleneckHop | None:
    """The hop whose micro-batch transfer takes longest under the proposal's wire (the live model's hop term); None
    for a single stage. Figures are bounded to what a record holds."""
    hops = proposal.plan.micro_batch_hops_s(proposal.execution.micro_batches)  # (d_pp − 1, d_dp)
    if hops.size == 0:
        return None
    stage, pipeline = (int(i) for i in np.unravel_index(np.argmax(hops), hops.shape))
    a, b = (int(d) for d in proposal.plan.grid[stage:stage + 2, pipeline])
    network = proposal.view.network
    return BottleneckHop(
        stage=stage, pipeline=pipeline,
        latency_ms=min(float(network.latency_ms[a, b]), MAX_LATENCY_MS),
        bandwidth_mbps=min(float(network.bandwidth_gbps[a, b]) * MBPS_PER_GBPS, MAX_BANDWIDTH_MBPS),
        estimated=(min(a, b), max(a, b)) in proposal.view.estimated,
        micro_batch_s=min(float(hops[stage, pipeline]), MAX_SECONDS))
