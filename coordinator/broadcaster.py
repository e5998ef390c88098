"""The coordinator's loop: read the peers' records, let the replanner decide, publish signed assignment versions.

The assignment lives under the swarm's `assignment` key, in the subkey signed by the coordinator's key, so that
clients pinned to that key can tell it from anyone else's (docs/hivemind.md, signed assignments). It is
republished every TTL/2 with expiry TTL.

The step belongs to the plan: a new plan starts one past the last step the members of the current plan reported
under it (`start_step`), never below the current plan's own start, and the coordinator remembers that step, so that
neither a stranger's Progress record nor the expiry of the members' records can move training forward or back.

Versions only grow, also across a restart with the same identity: the coordinator keeps its version counter, that
step and the plan in force in a small JSON state file next to its identity file (`CoordinatorState`, written
atomically), and on start goes above the highest version it finds there, in its own assignment still in the DHT,
and in the peers' records (clients ignore a version not above the one they follow). It adopts the plan in force
(Replanner.adopt) rather than reshuffling a swarm that is training well; a plan that none of its peers follows any
more (they restarted and lost their weights, or left) is forgotten with its step, and the swarm is planned afresh.
"""
from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import hivemind
from hivemind.utils import get_dht_time
from hivemind.utils.crypto import RSAPrivateKey

from hetswarm.coordinator.planner import Proposal, Replanner
from hetswarm.protocol.errors import ConfigError
from hetswarm.protocol.keys import ASSIGNMENT_FIELD, PEERS_FIELD, PROGRESS_FIELD
from hetswarm.protocol.record_store import SwarmRecords
from hetswarm.protocol.records import Assignment, PeerRecord, PeerRole, Progress

__all__ = ["BroadcastConfig", "Broadcaster", "CoordinatorState", "build_assignment", "load_state", "save_state",
           "standing", "start_step", "state_path_for"]

logger = logging.getLogger(__name__)

STATE_SAVE_INTERVAL_S = 5.0
"""The remembered step is written at most this often between versions (each version is written at once)."""
RECOVERY_READS = 3
"""Attempts at each read of the swarm at start-up, before the coordinator goes on with what it has."""


@dataclass(frozen=True, kw_only=True, slots=True)
class BroadcastConfig:
    swarm: str
    ttl_s: float = 60.0
    """Expiry of the published assignment; it is refreshed every TTL/2."""
    interval_s: float = 1.0
    """How often the peers' records are read."""
    request_timeout_s: float = 15.0
    """Deadline of one DHT read or store."""
    save_plan: Path | None = None
    """Where to write the latest plan as JSON (Proposal.to_dict() plus version and reason) at each version."""
    state_path: Path | None = None
    """Where the version counter, the remembered step and the plan in force survive a restart (`state_path_for`
    of the identity file); None keeps nothing, as for a throw-away identity."""

    def __post_init__(self) -> None:
        if self.ttl_s < 2 or self.interval_s <= 0 or self.request_timeout_s <= 0:
            raise ConfigError(f"bad timing: ttl_s={self.ttl_s} (>= 2), interval_s={self.interval_s}, "
                             f"request_timeout_s={self.request_timeout_s}")


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
    step: int = 0
    """The step the next plan starts at (`start_step`)."""
    assignment: Assignment | None = None
    """The plan in force: the last one published."""

    def to_dict(self) -> dict[str, Any]:
        return {"coordinator_id": self.coordinator_id, "version": self.version, "step": self.step,
                "assignment": None if self.assignment is None else self.assignment.dict()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CoordinatorState:
        """Raises: ValueError, TypeError, KeyError on a value that is not a state."""
        version, step = data["version"], data["step"]
        if not (isinstance(version, int) and isinstance(step, int) and version >= 0 and step >= 0):
            raise ValueError(f"version and step must be non-negative integers, got {version!r} and {step!r}")
        assignment = None if data["assignment"] is None else Assignment.parse_obj(data["assignment"])
        return cls(coordinator_id=str(data["coordinator_id"]), version=version, step=step, assignment=assignment)


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
    _write_json(path, state.to_dict(), durable=True)


def start_step(current: Assignment | None, progress: Mapping[str, Progress], *, remembered: int = 0) -> int:
    """The step a new plan starts at: one past the last step the current plan's members reported under it.

    A Progress step is the last step its peer completed (and steps are applied by the whole plan or by nobody), and
    a plan trains its `step` first (client/training/trainer.py), so the next plan starts at that + 1. Only members
    count, under the current version: anyone can publish Progress, and a member's record of an older plan says
    nothing about this one. Never below the current plan's own start or `remembered` (what the coordinator already
    knew), so that expired records cannot send training back.

    Args:
        progress: Progress records by the peer id that signed them.
    """
    floor = max(remembered, current.step if current is not None else 0)
    if current is None:
        return floor
    reported = [record.step for signer, record in progress.items() if signer == record.peer_id
                and signer in current.roles and record.assignment_version == current.version]
    return max([floor] + [step + 1 for step in reported])


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


def highest_followed_version(records: Mapping[str, PeerRecord]) -> int:
    """The highest assignment version any peer says it follows: a new version must be above it to be followed."""
    return max((r.assignment_version or 0 for r in records.values()), default=0)


def build_assignment(proposal: Proposal, *, coordinator_id: str, version: int, reason: str, step: int) -> Assignment:
    """The signed record clients follow, from a priced proposal."""
    d_pp, d_dp = proposal.plan.grid.shape
    pipelines = proposal.pipelines
    return Assignment(
        coordinator_id=coordinator_id,
        version=version,
        model=proposal.model.to_dict(),
        d_pp=d_pp,
        d_dp=d_dp,
        stage_layers=[[a, b] for a, b in proposal.model.stage_layers(d_pp)],
        roles={peer: PeerRole(stage=stage, replica=replica)
               for replica, chain in enumerate(pipelines) for stage, peer in enumerate(chain)},
        pipelines=pipelines,
        predicted_step_s=float(proposal.live.total_s),
        breakdown=proposal.live.to_dict() | {"paper_cost_s": float(proposal.plan.cost_s)},
        micro_batches=proposal.model.micro_batches,
        step=step,
        reason=reason[:256],
        issued_at=get_dht_time(),
    )


class Broadcaster:
    """The coordinator's loop (module docstring); it starts from what a previous run left in `config.state_path`."""

    def __init__(self, dht: hivemind.DHT, *, private_key: RSAPrivateKey, coordinator_id: str,
                 replanner: Replanner, config: BroadcastConfig):
        state = load_state(config.state_path, coordinator_id) if config.state_path is not None else None
        self.dht, self.private_key, self.coordinator_id = dht, private_key, coordinator_id
        self.records = SwarmRecords(dht, config.swarm, private_key=private_key, timeout_s=config.request_timeout_s)
        self.replanner, self.config = replanner, config
        self.assignment: Assignment | None = None
        """What this run publishes; None until its first version."""
        self.state = state or CoordinatorState(coordinator_id=coordinator_id)
        """The version counter, the remembered step and the plan in force (also a previous run's, until replaced)."""
        self._taking_over: Assignment | None = None
        """A previous run's plan, until the first read of the peers' records says whether it still holds."""
        self._published_at = -math.inf
        self._saved_at = -math.inf
        self._saved: CoordinatorState | None = state

    async def run(self, stop: asyncio.Event) -> None:
        """Plans and publishes until `stop` is set."""
        await self._recover()
        try:
            while not stop.is_set():
                records = await self._read(PEERS_FIELD)
                if records is not None:
                    self._keep_above(highest_followed_version(records))
                    if self._taking_over is not None:
                        self._take_over(records)
                    decision = await asyncio.to_thread(self.replanner.decide, records, time.monotonic())
                    if decision is not None:
                        await self._announce(*decision, version=self.state.version + 1)
                await self._track_progress()
                if self.assignment is not None and time.monotonic() - self._published_at >= self.config.ttl_s / 2:
                    await self._publish()
                try:
                    await asyncio.wait_for(stop.wait(), timeout=self.config.interval_s)
                except TimeoutError:
                    pass
        finally:
            self._save_state(force=True)

    async def _recover(self) -> None:
        """Versions above anything the swarm has seen of us, and the plan in force handed to the replanner."""
        ours = (await self._read_at_start(ASSIGNMENT_FIELD) or {}).get(self.coordinator_id)
        peers = await self._read_at_start(PEERS_FIELD) or {}
        saved, in_force = self.state.version, self.state.assignment
        if ours is not None and (in_force is None or ours.version > in_force.version):
            in_force = ours
        followed = highest_followed_version(peers)
        highest = max(saved, ours.version if ours is not None else 0, followed)
        self._keep_above(highest)
        if in_force is not None:
            self.state = replace(self.state, assignment=in_force, step=max(self.state.step, in_force.step))
        if highest == 0 and in_force is None:
            return
        logger.info(f"Versions go on above v{highest} (saved: v{saved}, ours still in the DHT: "
                    f"v{ours.version if ours else 0}, followed by peers: v{followed})")
        self._taking_over = in_force

    def _take_over(self, records: dict[str, PeerRecord]) -> None:
        """Adopts the previous run's plan if its peers still follow it; forgets it, and its step, if they do not."""
        plan, self._taking_over = self._taking_over, None
        match standing(plan, records):
            case "in force":
                if self.replanner.adopt(plan):
                    logger.info(f"Adopting plan v{plan.version} ({plan.d_dp} pipelines × {plan.d_pp} stages) once "
                                f"its {len(plan.roles)} peers are in view; it goes on from step {self.state.step} or "
                                f"later")
            case "superseded":
                logger.warning(f"The peers of plan v{plan.version} follow a later version of ours that was not "
                               f"saved; planning afresh from step {self.state.step} or later")
            case "abandoned":
                logger.info(f"No peer follows plan v{plan.version} any more (they restarted or left); planning "
                            f"afresh from step 0")
                self.state = replace(self.state, assignment=None, step=0)

    def _keep_above(self, version: int) -> None:
        """Makes the next version exceed `version`: clients follow only versions above the one they have."""
        if version > self.state.version:
            if self.assignment is not None:  # past the start: a peer follows a version we did not know of
                logger.info(f"A peer follows v{version}, above our v{self.state.version}; our next version exceeds it")
            self.state = replace(self.state, version=version)

    async def _announce(self, proposal: Proposal, reason: str, *, version: int) -> None:
        progress = await self._read(PROGRESS_FIELD)
        step = start_step(self.state.assignment, progress or {}, remembered=self.state.step)
        self.assignment = build_assignment(proposal, coordinator_id=self.coordinator_id, version=version,
                                           reason=reason, step=step)
        self.state = replace(self.state, version=version, step=step, assignment=self.assignment)
        self._save_state(force=True)
        d_pp, d_dp = proposal.plan.grid.shape
        logger.info(f"Publishing v{version}: {d_dp} pipelines × {d_pp} stages from step {step}, "
                    f"{len(proposal.standbys)} standby, predicted {proposal.live.total_s:.3f} s/step ({reason})")
        await self._publish()
        if self.config.save_plan is not None:
            _write_json(self.config.save_plan, proposal.to_dict() | {
                "version": version, "reason": reason, "coordinator_id": self.coordinator_id})

    async def _track_progress(self) -> None:
        """Remembers how far the plan in force got, so that the next plan starts there even once the members'
        Progress records have expired (a restart included: the step is in the state file)."""
        if self.state.assignment is None:
            return
        progress = await self._read(PROGRESS_FIELD)
        if progress is None:
            return
        step = start_step(self.state.assignment, progress, remembered=self.state.step)
        if step != self.state.step:
            self.state = replace(self.state, step=step)
            self._save_state()

    def _save_state(self, *, force: bool = False) -> None:
        """Writes the state when it changed: at once for a new version, else at most every STATE_SAVE_INTERVAL_S."""
        path = self.config.state_path
        if path is None or self.state == self._saved:
            return
        if not force and time.monotonic() - self._saved_at < STATE_SAVE_INTERVAL_S:
            return
        try:
            save_state(path, self.state)
        except OSError as e:  # the swarm's records still keep versions growing; say so and keep coordinating
            logger.warning(f"Could not save the coordinator state to {path}: {e}")
            return
        self._saved, self._saved_at = self.state, time.monotonic()

    async def _publish(self) -> None:
        self._published_at = time.monotonic()
        try:
            stored = await self.records.publish(self.assignment, ttl_s=self.config.ttl_s)
        except TimeoutError:
            stored = False
        if not stored:
            logger.warning(f"No DHT node took assignment v{self.assignment.version}; retrying")
            self._published_at = -math.inf

    async def _read(self, field: str) -> dict | None:
        """The swarm's records under one key; None (not an empty swarm) when the read timed out."""
        try:
            return await self.records.read(field)
        except TimeoutError:
            logger.warning(f"Reading the swarm's {field!r} records timed out after {self.config.request_timeout_s} s")
            return None

    async def _read_at_start(self, field: str) -> dict | None:
        """As `_read`, a few times: what the swarm remembers of us decides the versions we may publish."""
        for _ in range(RECOVERY_READS):
            if (found := await self._read(field)) is not None:
                return found
        logger.warning(f"Could not read the swarm's {field!r} records at start; going on without them")
        return None


def _write_json(path: Path, data: dict, *, durable: bool = False) -> None:
    """Written whole or not at all: readers never see half a plan; `durable` also survives a power cut (fsync of
    the file before the rename and of the folder after it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    with open(partial, "w") as file:
        json.dump(data, file, indent=1)
        if durable:
            file.flush()
            os.fsync(file.fileno())
    os.replace(partial, path)
    if durable:
        folder = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)
