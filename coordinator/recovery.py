"""A coordinator's start after a restart: versions above anything the swarm has seen of it, and the plan in force
taken over if its peers still follow it (the rules are in coordinator/broadcaster.py's docstring)."""
from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import replace

from hetswarm.coordinator.checkpoint_ledger import CheckpointLedger
from hetswarm.coordinator.replanner import Replanner
from hetswarm.coordinator.run_state import CoordinatorState, highest_followed_version, standing
from hetswarm.protocol.keys import ASSIGNMENT_FIELD, PEERS_FIELD
from hetswarm.protocol.records import Assignment, PeerRecord

__all__ = ["RECOVERY_READS", "recover", "take_over"]

logger = logging.getLogger(__name__)

RECOVERY_READS = 3
"""Attempts at each read of the swarm at start-up, before the coordinator goes on with what it has."""


async def recover(read: Callable[[str], Awaitable[dict | None]], state: CoordinatorState, ledger: CheckpointLedger
                  ) -> tuple[CoordinatorState, Assignment | None]:
    """The state to go on from, its version above the highest the swarm shows of us, and the plan in force to take
    over once the peers' records say whether it still holds (None: none). `read` reads one of the swarm's keys
    (None when the read timed out)."""
    ours = (await _read_at_start(read, ASSIGNMENT_FIELD) or {}).get(state.coordinator_id)
    peers = await _read_at_start(read, PEERS_FIELD) or {}
    saved, in_force = state.version, state.assignment
    if ours is not None and (in_force is None or ours.version > in_force.version):
        in_force = ours
    followed = highest_followed_version(peers, in_force)
    highest = max(saved, ours.version if ours is not None else 0, followed)
    state = replace(state, version=highest)  # highest counts the saved version too
    if in_force is not None:
        state = replace(state, assignment=in_force, step=max(state.step, in_force.step))
        ledger.follow(in_force)
    if highest == 0 and in_force is None:
        return state, None
    logger.info(f"Versions go on above v{highest} (saved: v{saved}, ours still in the DHT: "
                f"v{ours.version if ours else 0}, followed by peers: v{followed})")
    return state, in_force


def take_over(plan: Assignment, records: dict[str, PeerRecord], replanner: Replanner, state: CoordinatorState
              ) -> CoordinatorState:
    """Adopts the previous run's plan if its peers still follow it; forgets it, and its step, if they do not."""
    match standing(plan, records):
        case "in force":
            if replanner.adopt(plan):
                logger.info(f"Adopting plan v{plan.version} ({plan.d_dp} pipelines × {plan.d_pp} stages) once "
                            f"its {len(plan.roles)} peers are in view; it goes on from step {state.step} or later")
        case "superseded":
            logger.warning(f"The peers of plan v{plan.version} follow a later version of ours that was not "
                           f"saved; planning afresh from step {state.step} or later")
        case "abandoned":
            logger.info(f"No peer follows plan v{plan.version} any more (they restarted or left); planning "
                        f"afresh from step 0")
            return replace(state, assignment=None, step=0)
    return state


async def _read_at_start(read: Callable[[str], Awaitable[dict | None]], field: str) -> dict | None:
    """`read(field)`, a few times: what the swarm remembers of us decides the versions we may publish."""
    for _ in range(RECOVERY_READS):
        if (found := await read(field)) is not None:
            return found
    logger.warning(f"Could not read the swarm's {field!r} records at start; going on without them")
    return None
