"""Sticky roles: a re-plan moves a peer off its stage only when the move pays for itself.

A peer that changes stage (or takes one for the first time, or keeps its stage under a new cut of the layers) must
first download the parameters and AdamW state of the layers it lacks from a peer that holds them (client/training/state_handoff.py): 12 bytes per parameter in fp32 (the value
and two moments), over the best link from a holder, the movers in parallel. So every re-plan weighs two candidates:

* the *sticky* plan: the plan in force with its gone peers replaced. Each vacancy is filled by the standby that
  makes the plan fastest; when standbys run out, pipelines with holes are dropped (their survivors become
  standbys), as long as the shape the operator fixed still holds;
* the *searched* plan: the scheduler's best over the same peers.

The searched plan wins when it is predicted at least ``improvement`` faster per step than the sticky one (the
hysteresis the replanner already applies to plans on unchanged peers) and its extra hand-off time is won back
within ``payback_steps`` steps. No change counts as free: a plan whose movers' parallel downloads would end sooner
than the sticky plan's (measured links are noisy; on loopback they are all noise) still costs every peer a restart
under a new version, so with ``payback_steps = 0`` the sticky plan always stays. The reason says which peers moved
and why.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from hetswarm.coordinator.planner import PlannerConfig, Proposal, deployed
from hetswarm.coordinator.scheduling.cost_model import edge_time_s
from hetswarm.coordinator.scheduling.live_cost import Execution, NoFeasiblePlan
from hetswarm.coordinator.swarm_view import SwarmView
from hetswarm.protocol.keys import short_id
from hetswarm.protocol.model_config import ModelConfig
from hetswarm.protocol.units import BYTES_PER_GB
from hetswarm.protocol.wire_format import candidate_wires

__all__ = ["STATE_BYTES_PER_PARAM", "Migration", "held_layers", "held_stages", "migration", "search_pays",
           "sticky_or_searched", "sticky_pipelines"]

STATE_BYTES_PER_PARAM = 12
"""fp32 parameter + AdamW's two fp32 moments."""


@dataclass(frozen=True, slots=True)
class Migration:
    """Who must download a stage's state to follow a plan, and how long the slowest of them takes."""

    moves: dict[str, int]
    """Peer → the stage it takes and does not hold."""
    seconds: float

    def describe(self) -> str:
        if not self.moves:
            return "nobody moves"
        moved = ", ".join(f"{short_id(peer)}→stage {stage}" for peer, stage in sorted(self.moves.items()))
        return f"moved {len(self.moves)}: {moved}"


def held_stages(pipelines: list[list[str]]) -> dict[str, int]:
    """Peer → the stage it holds under a plan."""
    return {peer: stage for chain in pipelines for stage, peer in enumerate(chain)}


def held_layers(pipelines: list[list[str]], stage_layers: list[tuple[int, int]]) -> dict[str, tuple[int, int]]:
    """Peer → the layers [a, b) it holds under a plan cut as `stage_layers`."""
    return {peer: tuple(stage_layers[stage]) for peer, stage in held_stages(pipelines).items()}


def migration(pipelines: list[list[str]], stage_layers: list[tuple[int, int]], held: Mapping[str, tuple[int, int]],
              view: SwarmView, model: ModelConfig) -> Migration:
    """The hand-offs a plan cut as `stage_layers` needs from the layers the peers hold now (module docstring): a
    peer downloads the layers of its stage it does not hold (a new cut moves state too), from the best of the peers
    that hold some of them; layers no peer in view holds are priced at 0 (they resume from checkpoints or the seed,
    whatever the plan)."""
    index = {peer: i for i, peer in enumerate(view.peer_ids)}
    moves, seconds = {}, 0.0
    for peer, stage in held_stages(pipelines).items():
        wanted = tuple(stage_layers[stage])
        missing = _params(model, wanted) - _params(model, _overlap(wanted, held.get(peer)))
        if missing == 0:
            continue
        moves[peer] = stage
        holders = [index[h] for h, layers in held.items() if _overlap(wanted, layers) and h in index and h != peer]
        if holders and peer in index:
            network, me = view.network, index[peer]
            state_gb = missing * STATE_BYTES_PER_PARAM / BYTES_PER_GB
            times = edge_time_s(network.latency_ms[holders, me], network.bandwidth_gbps[holders, me], state_gb)
            seconds = max(seconds, float(times.min()))
    return Migration(moves, seconds)


def search_pays(searched: Migration, sticky: Migration, gain_s: float, sticky_step_s: float, *,
                improvement: float, payback_steps: int) -> bool:
    """Whether the searched plan, `gain_s` faster per step than the sticky one, is worth its moves (module
    docstring)."""
    return gain_s >= improvement * sticky_step_s and gain_s * payback_steps > max(searched.seconds - sticky.seconds, 0)


def _overlap(layers: tuple[int, int], other: tuple[int, int] | None) -> tuple[int, int] | None:
    if other is None or max(layers[0], other[0]) >= min(layers[1], other[1]):
        return None
    return max(layers[0], other[0]), min(layers[1], other[1])


def _params(model: ModelConfig, layers: tuple[int, int] | None) -> int:
    """Parameters of a layer range with the embedding if it starts the model and the head if it ends it."""
    if layers is None:
        return 0
    a, b = layers
    return model.params_of(b - a, first=a == 0, last=b == model.n_layers)


def sticky_pipelines(current: list[list[str]], view: SwarmView, *, d_dp: int | None, price
                     ) -> list[list[str]] | None:
    """The plan in force with its gone peers replaced (module docstring), or None when no part of it can be kept.

    Args:
        d_dp: the number of pipelines the operator fixed, or None.
        price: pipelines → predicted step seconds (raises NoFeasiblePlan when a peer cannot hold its stage).
    """
    present = set(view.peer_ids)
    pipelines = [list(chain) for chain in current]
    while pipelines:
        placed = {peer for chain in pipelines for peer in chain}
        standbys = sorted(present - placed)
        vacancies = [(r, s) for r, chain in enumerate(pipelines) for s, peer in enumerate(chain) if peer not in present]
        if len(vacancies) <= len(standbys):
            return _filled(pipelines, vacancies, standbys, price)
        if d_dp is not None:
            return None  # the operator fixed the pipelines: dropping one would change the shape
        holes = [r for r, chain in enumerate(pipelines) if any(peer not in present for peer in chain)]
        worst = max(holes, key=lambda r: sum(peer not in present for peer in pipelines[r]))
        pipelines.pop(worst)
    return None


def _filled(pipelines: list[list[str]], vacancies: list[tuple[int, int]], standbys: list[str], price
            ) -> list[list[str]] | None:
    """Each vacancy, in turn, filled by the standby with the lowest predicted step time. A candidate is priced with
    the vacancies after it held by the other standbys, in order: `price` needs every peer in view, and two or more
    peers often go at once (every replica of a stage, say)."""
    pipelines = [list(chain) for chain in pipelines]
    for k, (r, s) in enumerate(vacancies):
        best, best_s = None, np.inf
        for standby in standbys:
            trial = [list(chain) for chain in pipelines]
            trial[r][s] = standby
            for (later_r, later_s), other in zip(vacancies[k + 1:], [p for p in standbys if p != standby]):
                trial[later_r][later_s] = other
            try:
                seconds = price(trial)
            except NoFeasiblePlan:
                continue
            if seconds < best_s:
                best, best_s = standby, seconds
        if best is None:
            return None
        pipelines[r][s] = best
        standbys.remove(best)
    return pipelines


def sticky_or_searched(view: SwarmView, searched: Proposal, in_force: list[list[str]], runs: Execution,
                       config: PlannerConfig) -> tuple[Proposal, str]:
    """The plan in force with its gaps filled, run as it `runs`, unless the search's plan pays for its moves
    (module docstring); and which peers move, and why."""
    model, wires = config.model, candidate_wires(config.compression, config.model)
    held = held_layers(in_force, runs.stage_layers)
    kept = sticky_pipelines(in_force, view, d_dp=config.d_dp,  # peers placed for the lightest wire, as the search does
                            price=lambda pipelines: deployed(view, pipelines, model, wires[-1:], runs).live.total_s)
    moves = migration(searched.pipelines, searched.execution.stage_layers, held, view, model)
    try:
        sticky = deployed(view, kept, model, wires, runs) if kept is not None else None  # its own links' codecs
    except NoFeasiblePlan:
        sticky = None
    if sticky is None:
        return searched, moves.describe()
    gain_s = sticky.live.total_s - searched.live.total_s
    staying = migration(kept, runs.stage_layers, held, view, model)
    extra_s = moves.seconds - staying.seconds
    if search_pays(moves, staying, gain_s, sticky.live.total_s, improvement=config.improvement,
                   payback_steps=config.payback_steps):
        faster = f"the search's plan is {gain_s / sticky.live.total_s:.0%} faster per step"
        if not moves.moves:
            return searched, f"nobody changes stage, the pipelines are re-paired: {faster}"
        return searched, (f"{moves.describe()}: {faster} and pays back its {max(extra_s, 0):.1f} s of hand-off "
                          f"in {math.ceil(max(extra_s, 0) / gain_s)} steps")
    return sticky, staying.describe()
