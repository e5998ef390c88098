"""Which codec each transfer of a placed plan travels in, and what the plan costs sent that way.

A plan's wire (protocol/wire_format.py) may give each pipeline hop and each stage group's all-reduce a codec of its
own. `price_wire` prices a placement for one wire, every hop for its own codec's bytes; `choose_wire` is the `auto`
compression policy: of the uniform wires, the least lossy predicted within AUTO_TOLERANCE of the fastest, then per
transfer the least lossy codec that keeps the step there. Compression buys speed only where bytes are on the
critical path, and costs precision wherever it is used, so a transfer whose time hides behind others' keeps fp32.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from hetswarm.coordinator.scheduling.cost_model import PaperCostModel, Payloads
from hetswarm.coordinator.scheduling.live_cost import Execution, LiveBreakdown, predict_step_s
from hetswarm.coordinator.scheduling.live_objective import Hardware
from hetswarm.coordinator.scheduling.plan import Plan, cost_plan
from hetswarm.protocol.network import Network
from hetswarm.protocol.wire_format import AUTO_TOLERANCE, CODECS, Codec, WireFormat

__all__ = ["PricedWire", "choose_wire", "price_wire"]


@dataclass(frozen=True, kw_only=True, slots=True)
class PricedWire:
    """A placement priced by both cost models for the bytes `wire` sends."""

    wire: WireFormat
    plan: Plan
    live: LiveBreakdown


def price_wire(network: Network, hardware: Hardware, grid: np.ndarray, wire: WireFormat, execution: Execution
               ) -> PricedWire:
    """`grid` deployed on `network`'s devices with `wire`, run as `execution`.

    Raises:
        NoFeasiblePlan: a stage does not fit its device's memory (live_cost.predict_step_s).
    """
    model = hardware.model
    d_pp, d_dp = grid.shape
    paper = PaperCostModel(network, Payloads.from_model(model, d_dp=d_dp, d_pp=d_pp, wire=wire), d_dp=d_dp, d_pp=d_pp)
    stage_dp_bytes = np.array([wire.allreduce_payload_bytes(model, count, first=s == 0, last=s == d_pp - 1, stage=s)
                               for s, count in enumerate(execution.layer_counts)])
    hop_pp_bytes = None if wire.hops is None else np.array(
        [[model.pp_payload_bytes(d_dp, wire.hop_bytes_per_value(s, r)) for r in range(d_dp)] for s in range(d_pp - 1)])
    plan = cost_plan(paper, grid, stage_dp_bytes, hop_pp_bytes, wire.allreduce_rounds)
    live = predict_step_s(plan, model, tflops=hardware.tflops, memory_gib=hardware.memory_gib,
                          latency_ms=network.latency_ms, execution=execution)
    return PricedWire(wire=wire, plan=plan, live=live)


def choose_wire(network: Network, hardware: Hardware, grid: np.ndarray, wires: list[WireFormat],
                execution: Execution) -> PricedWire:
    """Of `wires` (least lossy first), the first predicted within AUTO_TOLERANCE of the fastest; with several (the
    `auto` policy's uniform wires), each hop and stage group then takes the least lossy codec that keeps the step
    there (`_per_link`)."""
    priced = [price_wire(network, hardware, grid, wire, execution) for wire in wires]
    budget_s = min(p.live.total_s for p in priced) * (1 + AUTO_TOLERANCE)
    chosen = next(p for p in priced if p.live.total_s <= budget_s)
    return chosen if len(wires) == 1 else _per_link(network, hardware, chosen, budget_s, execution)


def _per_link(network: Network, hardware: Hardware, uniform: PricedWire, budget_s: float, execution: Execution
              ) -> PricedWire:
    """`uniform`'s placement with a codec per hop and per stage group: starting from `uniform`'s wire, each
    transfer, the quickest first, takes the least lossy codec that keeps the predicted step within `budget_s`.

    The quickest go first because precision costs them least: a hop inside a site keeps fp32 while the hops between
    regions stay in the lighter codec. A transfer refused stays refused (every later change only adds bytes), so
    in the result no transfer could go one codec less lossy alone. A plan whose transfers all end in one codec gets
    that codec's plain wire."""
    wire, grid = uniform.wire, uniform.plan.grid
    d_pp, d_dp = grid.shape
    hops = [[wire.activations] * d_dp for _ in range(d_pp - 1)]
    groups = [wire.allreduce] * d_pp
    hop_s = uniform.plan.micro_batch_hops_s(execution.micro_batches)  # (d_pp − 1, d_dp)
    transfers = sorted([(float(hop_s[s, r]), hops[s], r) for s in range(d_pp - 1) for r in range(d_dp)]
                       + [(float(t), groups, s) for s, t in enumerate(uniform.plan.stage_allreduce_s)],
                       key=lambda transfer: transfer[0])
    best = uniform
    for _, codecs, index in transfers:
        lightest = codecs[index]
        for codec in CODECS[: CODECS.index(lightest)]:  # the less lossy ones, least lossy first
            codecs[index] = codec
            trial = price_wire(network, hardware, grid, _link_wire(wire, hops, groups), execution)
            if trial.live.total_s <= budget_s:
                best = trial
                break
        else:
            codecs[index] = lightest
    return best


def _link_wire(wire: WireFormat, hops: list[list[Codec]], groups: list[Codec]) -> WireFormat:
    """`wire` with these codecs per hop and per stage group; a plain wire where a list holds one codec."""
    hop_codecs, group_codecs = {codec for row in hops for codec in row}, set(groups)
    hop = hop_codecs.pop() if len(hop_codecs) == 1 else wire.activations
    group = group_codecs.pop() if len(group_codecs) == 1 else wire.allreduce
    return replace(wire, activations=hop, gradients=hop, allreduce=group,
                   hops=tuple(tuple(row) for row in hops) if hop_codecs else None,
                   groups=tuple(groups) if group_codecs else None)
