"""A coordinator's start after a restart: versions above anything the swarm has seen of it, and the plan in force
taken over if its peers still follow it (the rules are in coordinator/broadcaster.py's docstring)."""
from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import replace

from hetswarm.coordinator.checkpoint_ledger import CheckpointLedger
from hetswarm.coordinator.plan_in_force import PlanInForce
from hetswarm.coordinator.run_state import CoordinatorState, highest_followed_version, standing
from hetswarm.protocol.keys import ASSIGNMENT_FIELD, PEERS_FIELD
from hetswarm.protocol.records import Assignment, PeerRecord

__all__ = ["RECOVERY_READS", "recover", "take_over"]

logger = logging.getLogger(__name__)

RECOVERY_READS = 3
"""Attempts at each read of the swarm at start-up, before the coordinator goes on with what it has."""


async def recover(read: Callable[[str], Awaitable[dict | None]], state: CoordinatorState, ledger: CheckpointLedger
                  ) -> CoordinatorState:
    """The state to go on from: its version above the highest the swarm shows of us, and the plan in force
    `recovered` (coordinator/plan_in_force.py) until the peers' records say whether it still holds (`take_over`).
    `read` reads one of the swarm's keys (None when the read timed out)."""
    ours = (await _read_at_start(read, ASSIGNMENT_FIELD) or {}).get(state.coordinator_id)
    peers = await _read_at_start(read, PEERS_FIELD) or {}
    saved, in_force = state.version, state.plan.assignment if state.plan is not None else None
    if ours is not None and (in_force is None or ours.version > in_force.version):
        in_force = ours
    followed = highest_followed_version(peers, in_force)
    highest = max(saved, ours.version if ours is not None else 0, followed)
    state = replace(state, version=highest)  # highest counts the saved version too
    if in_force is not None:
        state = replace(state, plan=PlanInForce(assignment=in_force, origin="recovered"),
                        step=max(state.step, in_force.step))
        ledger.follow(in_force)
    if highest == 0 and in_force is None:
        return state
    logger.info(f"Versions go on above v{highest} (saved: v{saved}, ours still in the DHT: "
                f"v{ours.version if ours else 0}, followed by peers: v{followed})")
    return state


def take_over(state: CoordinatorState, records: dict[str, PeerRecord], fits: Callable[[Assignment], bool]
              ) -> CoordinatorState:
    """The recovered plan `adopting` if its peers still follow it and it `fits` this run; kept as a `previous run`
    plan if not; forgotten, with its step, if nobody follows it any more."""
    plan = state.plan.assignment
    match standing(plan, records):
        case "in force" if fits(plan):
            logger.info(f"Adopting plan v{plan.version} ({plan.d_dp} pipelines × {plan.d_pp} stages) once "
                        f"its {len(plan.roles)} peers are in view; it goes on from step {state.step} or later")
            return replace(state, plan=PlanInForce(assignment=plan, origin="adopting"))
        case "superseded":
            logger.warning(f"The peers of plan v{plan.version} follow a later version of ours that was not "
                           f"saved; planning afresh from step {state.step} or later")
        case "abandoned":
            logger.info(f"No peer follows plan v{plan.version} any more (they restarted or left); planning "
                        f"afresh from step 0")
            return replace(state, plan=None, step=0)
    return replace(state, plan=PlanInForce(assignment=plan, origin="previous run"))


async def _read_at_start(read: Callable[[str], Awaitable[dict | None]], field: str) -> dict | None:
    """`read(field)`, a few times: what the swarm remembers of us decides the versions we may publish."""
    for _ in range(RECOVERY_READS):
        if (found := await read(field)) is not None:
            return found
    logger.warning(f"Could not read the swarm's {field!r} records at start; going on without them")
    return None
