"""What a coordinator remembers across a restart, and the step that belongs to the plan (the rules are explained
in broadcaster.py's docstring): the state file beside the identity, written atomically, and the pure functions
that read the swarm's records to decide where a restarted coordinator goes on.
"""
from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from hetswarm.coordinator.checkpoint_ledger import CheckpointLedger
from hetswarm.coordinator.plan_in_force import PlanInForce
from hetswarm.protocol.atomic_files import write_json
from hetswarm.protocol.keys import ReadyStep
from hetswarm.protocol.records import Assignment, PeerRecord, Progress

__all__ = ["CoordinatorState", "Standing", "StateFile", "highest_followed_version", "load_state", "save_state",
           "standing", "start_step", "state_path_for"]

logger = logging.getLogger(__name__)

STATE_SAVE_INTERVAL_S = 5.0
"""The remembered step is written at most this often between versions (each version is written at once)."""


def state_path_for(identity_path: Path) -> Path:
    """The state file of the coordinator whose identity is in `identity_path`: next to it, so both move together."""
    return identity_path.with_name(identity_path.name + ".state.json")


@dataclass(frozen=True, kw_only=True, slots=True)
class CoordinatorState:
    """What a coordinator must not forget across a restart: versions only grow, the step never goes back, and the
    plan in force is kept."""

    coordinator_id: str
    """The identity this state belongs to; another identity's state is never used."""
    version: int = 0
    """The last version published."""
    step: ReadyStep = 0
    """The step the next plan starts at (`start_step`)."""
    plan: PlanInForce | None = None
    """The plan in force: the last one published (its assignment is what the file keeps)."""
    checkpoints: dict[str, dict[str, str]] = field(default_factory=dict)
    """The savers' recorded checkpoint roots (coordinator/checkpoint_ledger.py, CheckpointLedger.to_json)."""

    def to_dict(self) -> dict[str, Any]:
        return {"coordinator_id": self.coordinator_id, "version": self.version, "step": self.step,
                "assignment": None if self.plan is None else self.plan.assignment.dict(),
                "checkpoints": self.checkpoints}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CoordinatorState:
        """Raises: ValueError, TypeError, KeyError on a value that is not a state."""
        version, step = data["version"], data["step"]
        if not (isinstance(version, int) and isinstance(step, int) and version >= 0 and step >= 0):
            raise ValueError(f"version and step must be non-negative integers, got {version!r} and {step!r}")
        plan = None if data["assignment"] is None else PlanInForce(
            assignment=Assignment.parse_obj(data["assignment"]), origin="recovered")
        checkpoints = CheckpointLedger.from_json(data.get("checkpoints", {})).to_json()  # a state file from before
        return cls(coordinator_id=str(data["coordinator_id"]), version=version, step=step, plan=plan,
                   checkpoints=checkpoints)


def load_state(path: Path, coordinator_id: str) -> CoordinatorState | None:
    """This coordinator's saved state, or None when there is none it can use (each reason logged): a missing file is
    a first start; an unreadable one, or another identity's, is ignored, because the swarm's records still keep
    versions growing (module docstring) and a coordinator that refused to start would stall the swarm."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        logger.info(f"No coordinator state at {path}: a first start")
        return None
    except OSError as e:
        logger.warning(f"Could not read the coordinator state {path} ({e}); going on from the swarm's records")
        return None
    try:
        state = CoordinatorState.from_dict(json.loads(text))
    except (ValueError, TypeError, KeyError) as e:  # pydantic's ValidationError is a ValueError
        logger.warning(f"Ignored the coordinator state {path}: it is not one ({type(e).__name__}: {e})")
        return None
    if state.coordinator_id != coordinator_id:
        logger.warning(f"Ignored the coordinator state {path}: it belongs to {state.coordinator_id}, not to this "
                       f"identity {coordinator_id}")
        return None
    return state


def save_state(path: Path, state: CoordinatorState) -> None:
    """Written whole and durably or not at all (temp file, fsync, os.replace), so a crash mid-write leaves the
    previous state."""
    write_json(path, state.to_dict(), durable=True)


class StateFile:
    """The state file of a running coordinator, written when the state changed: at once for a new version, else
    at most every STATE_SAVE_INTERVAL_S (the remembered step moves every step)."""

    def __init__(self, path: Path | None, saved: CoordinatorState | None) -> None:
        """`path` None keeps nothing (a throw-away identity); `saved`: what the file holds now."""
        self.path, self._saved, self._saved_at = path, saved, -math.inf

    def save(self, state: CoordinatorState, *, force: bool = False) -> None:
        if self.path is None or state == self._saved:
            return
        if not force and time.monotonic() - self._saved_at < STATE_SAVE_INTERVAL_S:
            return
        try:
            save_state(self.path, state)
        except OSError as e:  # the swarm's records still keep versions growing; say so and keep coordinating
            logger.warning(f"Could not save the coordinator state to {self.path}: {e}")
            return
        self._saved, self._saved_at = state, time.monotonic()


def start_step(current: Assignment | None, progress: Mapping[str, Progress], *, remembered: int = 0,
               alive: Collection[str] | None = None) -> ReadyStep:
    """The step a new plan starts at: one past the last step that every surviving member of the current plan
    reported applying under it.

    Steps are applied by the whole plan or by nobody, but a peer applies one as soon as it has every vote, so at the
    end of a plan its members may be one step apart; the lower step is the one they all hold (each keeps its last
    two states, client/training/state_handoff.py). A Progress step is the last step its peer applied when its
    health is `training`, and the step it is stuck at otherwise. Only members count, under the current version:
    anyone can publish Progress, and a member's record of an older plan says nothing about this one. Never below
    the current plan's own start or `remembered` (what the coordinator already knew), so that expired records
    cannot send training back.

    Args:
        progress: Progress records by the peer id that signed them.
        alive: the members still in view; None counts every member.
    """
    floor = max(remembered, current.step if current is not None else 0)
    if current is None:
        return floor
    applied = [record.applied for signer, record in progress.items()
               if signer == record.peer_id and signer in current.roles
               and record.assignment_version == current.version and (alive is None or signer in alive)]
    return max(floor, min(applied) + 1) if applied else floor


Standing = Literal["in force", "superseded", "abandoned"]


def standing(plan: Assignment, records: Mapping[str, PeerRecord]) -> Standing:
    """Whether a previous run's plan still holds in the swarm, from its peers' records: `in force` while one of them
    follows it, `superseded` when they follow a later version of ours that this run does not know, else
    `abandoned`: its peers restarted (and lost their weights) or left, so neither the plan nor its step carries on."""
    followed = [r.assignment_version for peer, r in records.items()
                if peer in plan.roles and r.assignment_version is not None]
    if plan.version in followed:
        return "in force"
    return "superseded" if any(version > plan.version for version in followed) else "abandoned"


def highest_followed_version(records: Mapping[str, PeerRecord], plan: Assignment | None = None) -> int:
    """The highest assignment version a peer says it follows: a new version must be above it to be followed.

    Once there is a `plan`, only its members count, and only up to one version past it (one published but not yet
    saved here): anyone can claim a version, and a claim of a huge one, a stranger's or a member's, would otherwise
    push ours past the largest a record may carry. Without a plan (a coordinator that lost its state) every peer
    counts: that is the only way to learn what the swarm follows."""
    if plan is None:
        return max((r.assignment_version or 0 for r in records.values()), default=0)
    return max((r.assignment_version for p, r in records.items()
                if p in plan.roles and r.assignment_version is not None and r.assignment_version <= plan.version + 1),
               default=0)
