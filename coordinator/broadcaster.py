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
(coordinator/recovery.py, Replanner.fits) rather than reshuffling a swarm that is training well; a plan that none
of its peers follows any more (they restarted and lost their weights, or left) is forgotten with its step, and the
swarm is planned afresh. The plan in force, with its pricing and its origin, is held once, in the state
(coordinator/plan_in_force.py), and handed to the replanner each round.

Before it publishes a plan, the coordinator pings the peers it places (`silent`, client/peer/link_probe.py): a peer
killed since its record was last refreshed is still in view until the record expires, and its plan's members
report it only once a step fails, one reporter at a time. A placed peer that does not answer is left out as if a
member had reported it, and the plan is made again without it; a resume from checkpoints then never waits on a dead
peer that a member had not reported yet. The same ping checks a member's lone report that a peer is unreachable
(coordinator/reports.py) before the peer is planned out.
"""
from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

import hivemind
from hivemind.utils.crypto import RSAPrivateKey

from hetswarm.coordinator.admission import Admission
from hetswarm.coordinator.assignment_record import build_assignment
from hetswarm.coordinator.checkpoint_ledger import CheckpointLedger
from hetswarm.coordinator.failure_votes import judge_aborts, named_causes
from hetswarm.coordinator.loss_watch import LossWatch
from hetswarm.coordinator.notices import Notices
from hetswarm.coordinator.plan_in_force import PlanInForce
from hetswarm.coordinator.planner import Proposal
from hetswarm.coordinator.recovery import recover, take_over
from hetswarm.coordinator.replanner import Replanner
from hetswarm.coordinator.reports import ReportCheck
from hetswarm.coordinator.run_state import CoordinatorState, StateFile, highest_followed_version, load_state, start_step
from hetswarm.coordinator.screening import Screening
from hetswarm.coordinator.state_plan import (
    StatePlan,
    checkpoint_plan,
)
from hetswarm.coordinator.state_sourcing import StateSourcing
from hetswarm.protocol.atomic_files import write_json
from hetswarm.protocol.errors import ConfigError
from hetswarm.protocol.keys import PEERS_FIELD, PROGRESS_FIELD, short_id
from hetswarm.protocol.record_store import SwarmRecords, check_ttl
from hetswarm.protocol.records import (
    Aggregation,
    Assignment,
    PeerRecord,
    Progress,
)
from hetswarm.protocol.remembered_peers import RememberedPeers

__all__ = ["BroadcastConfig", "Broadcaster", "troubles"]

logger = logging.getLogger(__name__)

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
    checkpoint_every: int = 50
    """Steps between checkpoints, for the peers that keep them (coordinator/state_plan.py)."""
    checkpoint_every_s: float | None = None
    """Also at least this often, in the plan's predicted step time: a plan's checkpoints must fall on the same steps
    in every stage, so a time interval is turned into steps when the plan is made."""
    aggregation: Aggregation = "mean"
    """How stage groups combine gradients (client/training/robust_aggregation.py): CenteredClip for open swarms."""
    eval_every: int = 0
    """Steps between the pipelines' held-out losses (Assignment.eval_every); 0: none."""
    rollback_spike: float = 2.0
    """A step's loss above this multiple of the recent median rolls the swarm back to a checkpoint; 0: never
    (coordinator/loss_watch.py)."""
    lost_state_wait_s: float = 120.0
    """How long a plan waits for a peer that holds layers nobody else holds (a replica that comes back, or a
    checkpoint) before those layers start again from the seed."""

    def __post_init__(self) -> None:
        if self.checkpoint_every < 1 or self.lost_state_wait_s < 0 or (self.checkpoint_every_s or 1) <= 0:
            raise ConfigError(f"need checkpoint_every >= 1 and lost_state_wait_s >= 0, got {self.checkpoint_every} "
                              f"and {self.lost_state_wait_s}")
        if self.eval_every < 0:
            raise ConfigError(f"--eval-every must be 0 (none) or positive, got {self.eval_every}")
        check_ttl(self.ttl_s)
        if self.interval_s <= 0 or self.request_timeout_s <= 0:
            raise ConfigError(f"bad timing: interval_s={self.interval_s}, request_timeout_s={self.request_timeout_s}")


def troubles(plan: Assignment, progress: Mapping[str, Progress]) -> tuple[dict[str, list[str]], dict[str, str]]:
    """What the plan's members report under it: the peers of the plan each could not reach, and the members that
    gave up (with their reason). Only members count, about members: anyone can publish Progress."""
    unreachable, stalled = {}, {}
    for signer, record in progress.items():
        if signer != record.peer_id or signer not in plan.roles or record.assignment_version != plan.version:
            continue
        if peers := [peer for peer in record.unreachable if peer in plan.roles and peer != signer]:
            unreachable[signer] = peers
        if record.health == "stalled":
            stalled[signer] = record.reason or "no reason given"
    return unreachable, stalled


class Broadcaster:
    """The coordinator's loop (module docstring); it starts from what a previous run left in `config.state_path`."""

    def __init__(self, dht: hivemind.DHT, *, private_key: RSAPrivateKey, coordinator_id: str,
                 replanner: Replanner, config: BroadcastConfig, admission: Admission | None = None,
                 silent: Callable[[Collection[str]], Awaitable[set[str]]] | None = None):
        """
        Args:
            silent: which of the given peers answer no ping of this coordinator (module docstring); None publishes
                plans without asking.
        """
        state = load_state(config.state_path, coordinator_id) if config.state_path is not None else None
        self.silent = silent
        self.dht, self.private_key, self.coordinator_id = dht, private_key, coordinator_id
        self.records = SwarmRecords(dht, config.swarm, private_key=private_key, timeout_s=config.request_timeout_s)
        self.replanner, self.config = replanner, config
        self.losses = LossWatch(threshold=config.rollback_spike)
        self.reports = ReportCheck(silent, coordinator_id=coordinator_id, remember_s=replanner.config.suspect_s)
        self.state = state or CoordinatorState(coordinator_id=coordinator_id)
        """The version counter, the remembered step and the plan in force (also a previous run's, until replaced)."""
        self.ledger = CheckpointLedger.from_json(self.state.checkpoints)
        """The checkpoints a resume may load (coordinator/checkpoint_ledger.py)."""
        self._published_at = -math.inf
        self.state_file = StateFile(config.state_path, state)
        self._peers: dict[str, PeerRecord] = {}
        """The peers' records in view at the last read, screened."""
        self.remembered = RememberedPeers()
        self.screening = Screening(admission or Admission(swarm=config.swarm), self.ledger,
                                   n_layers=replanner.config.model.n_layers)
        self.notices = Notices(self.records, coordinator_id=coordinator_id, ttl_s=config.ttl_s)
        self.sourcing = StateSourcing(self.ledger, lost_state_wait_s=config.lost_state_wait_s)

    @property
    def published(self) -> Assignment | None:
        """The plan in force when this run published it (and refreshes it); None before its first version."""
        plan = self.state.plan
        return plan.assignment if plan is not None and plan.ours else None

    async def run(self, stop: asyncio.Event) -> None:
        """Plans and publishes until `stop` is set; a round that fails on something unforeseen is logged and the
        next one goes on (one bad input must not stop the coordinator of a whole swarm)."""
        self.state = await recover(self._read, self.state, self.ledger)
        try:
            while not stop.is_set():
                try:
                    await self._round()
                except Exception as e:
                    logger.exception(f"A coordinator round failed ({type(e).__name__}: {e}); going on")
                try:
                    await asyncio.wait_for(stop.wait(), timeout=self.config.interval_s)
                except TimeoutError:
                    pass
        finally:
            self.state_file.save(self.state, force=True)

    async def _round(self) -> None:
        """One read of the swarm: admit, plan, publish what changed, follow the plan's progress."""
        plan = self.state.plan
        records = await self._read(PEERS_FIELD, prefer=plan.assignment.roles if plan is not None else ())
        if records is not None:
            self._peers = records = self._screen(records)
            self._keep_above(highest_followed_version(records, plan.assignment if plan is not None else None))
            if plan is not None and plan.origin == "recovered":
                self.state = take_over(self.state, records, self.replanner.fits)
            waiting = self.sourcing.pending[0] if self.sourcing.pending is not None else None
            decision = await asyncio.to_thread(self.replanner.decide, records, time.monotonic(),
                                               in_force=self.state.plan, waiting=waiting)
            if decision is not None or self.sourcing.pending is not None:
                proposal, reason = decision or self.sourcing.pending
                if await self._all_answer(proposal):
                    await self._announce(proposal, reason, version=self.state.version + 1)
        await self._track_progress()
        await self._roll_back_on_spike()
        if self.published is not None and time.monotonic() - self._published_at >= self.config.ttl_s / 2:
            await self._publish()
        await self.notices.publish(self.screening.refused | self.replanner.left_out(time.monotonic()),
                                   self.screening.flagged, self.replanner.measuring.requests)

    def _screen(self, records: dict[str, PeerRecord]) -> dict[str, PeerRecord]:
        """The records to plan with (coordinator/screening.py); a checkpoint the ledger learned of is saved."""
        records, learned = self.screening.screen(records)
        self.replanner.trusted = self.screening.claims.confirmed
        if learned:
            self.state = replace(self.state, checkpoints=self.ledger.to_json())
            self.state_file.save(self.state)
        return records

    async def _all_answer(self, proposal: Proposal) -> bool:
        """Whether every peer `proposal` places answers our ping; the silent ones are left out of the next
        decision (module docstring)."""
        if self.silent is None:
            return True
        silent = await self.silent({peer for chain in proposal.pipelines for peer in chain})
        if not silent:
            return True
        logger.warning(f"{len(silent)} peer(s) the plan places do not answer a ping: "
                       f"{', '.join(short_id(peer) for peer in sorted(silent))}; planning again without them")
        self.replanner.note_trouble(unreachable={self.coordinator_id: sorted(silent)}, stalled={},
                                    now=time.monotonic())
        self.sourcing.pending = None
        return False

    def _keep_above(self, version: int) -> None:
        """Makes the next version exceed `version`: clients follow only versions above the one they have."""
        if version > self.state.version:
            if self.published is not None:  # past the start: a peer follows a version we did not know of
                logger.info(f"A peer follows v{version}, above our v{self.state.version}; our next version exceeds it")
            self.state = replace(self.state, version=version)

    async def _roll_back_on_spike(self) -> None:
        """Plans the same roles again from the newest checkpoint before a loss spike (coordinator/loss_watch.py)."""
        plan = self.state.plan
        if plan is None or not plan.ours:
            return
        if (origin := self.sourcing.after_spike(self.losses, self._peers, plan.pricing)) is not None:
            await self._announce(plan.pricing, "", version=self.state.version + 1, origin=origin)

    async def _announce(self, proposal: Proposal, reason: str, *, version: int, origin: StatePlan | None = None
                        ) -> None:
        """Publishes `proposal` as the next version, from the state the sourcing finds (or `origin`)."""
        in_force = self.state.plan.assignment if self.state.plan is not None else None
        if origin is None:
            progress = await self._read(PROGRESS_FIELD, prefer=in_force.roles if in_force is not None else ()) or {}
            origin = self.sourcing.origin(proposal, reason, in_force=in_force, remembered_step=self.state.step,
                                          records=self._peers, progress=progress)
            if origin is None:
                return
        step, reason = origin.step, "; ".join(part for part in (origin.note, reason) if part)
        assignment = build_assignment(
            proposal, coordinator_id=self.coordinator_id, version=version, reason=reason, step=step,
            handoff=origin.handoff, checkpoints=checkpoint_plan(proposal.pipelines, self._peers,
                                                               self._checkpoint_every(proposal)),
            aggregation=self.config.aggregation, eval_every=self.config.eval_every)
        self.sourcing.published(origin, assignment, in_force)
        self.state = replace(self.state, version=version, step=step,
                             plan=PlanInForce(assignment=assignment, origin="this run", pricing=proposal))
        self.state_file.save(self.state, force=True)
        d_pp, d_dp = proposal.plan.grid.shape
        logger.info(f"Publishing v{version}: {d_dp} pipelines × {d_pp} stages from step {step}, "
                    f"{len(proposal.standbys)} standby, predicted {proposal.live.total_s:.3f} s/step ({reason})"
                    + proposal.view.estimate_note())
        await self._publish()
        if self.config.save_plan is not None:
            write_json(self.config.save_plan, proposal.to_dict() | {
                "version": version, "reason": reason, "coordinator_id": self.coordinator_id})

    def _checkpoint_every(self, proposal: Proposal) -> int:
        every, seconds = self.config.checkpoint_every, self.config.checkpoint_every_s
        if seconds is None:
            return every
        return max(1, min(every, int(seconds / max(proposal.live.total_s, 1e-3))))

    async def _track_progress(self) -> None:
        """Remembers how far the plan in force got, so that the next plan starts there even once the members'
        Progress records have expired (a restart included: the step is in the state file)."""
        if self.state.plan is None:
            return
        plan = self.state.plan.assignment
        progress = await self._read(PROGRESS_FIELD, prefer=plan.roles)
        if progress is None:
            return
        self.screening.claims.observe(plan, progress)
        self.losses.observe(plan, progress)
        step = start_step(plan, progress, remembered=self.state.step)
        if step != self.state.step:
            self.state = replace(self.state, step=step)
            self.state_file.save(self.state)
        if self.state.plan.ours:
            unreachable, stalled = troubles(plan, progress)
            judged = await self.reports.judge(unreachable, time.monotonic())
            left_out = dict(judged.unreachable)
            gone = await self.reports.gone(named_causes(plan, progress), time.monotonic())
            if aborting := judge_aborts(plan, self.config.swarm, progress, gone=gone):
                left_out[self.coordinator_id] = sorted({*left_out.get(self.coordinator_id, ()), *aborting})
            if left_out or stalled:
                self.replanner.note_trouble(unreachable=left_out, stalled=stalled, now=time.monotonic(),
                                            reasons={**judged.reasons, **aborting})

    async def _publish(self) -> None:
        self._published_at = time.monotonic()
        try:
            stored = await self.records.publish(self.published, ttl_s=self.config.ttl_s)
        except TimeoutError:
            stored = False
        if not stored:
            logger.warning(f"No DHT node took assignment v{self.published.version}; retrying")
            self._published_at = -math.inf

    async def _read(self, field: str, *, prefer: Collection[str] = ()) -> dict | None:
        """The swarm's records under one key, the peers' as remembered (protocol/remembered_peers.py); None (not
        an empty swarm) when the read timed out."""
        try:
            if field != PEERS_FIELD:
                return await self.records.read(field, prefer=prefer)
            return await self.remembered.read(self.records, prefer=prefer)
        except TimeoutError:
            logger.warning(f"Reading the swarm's {field!r} records timed out after {self.config.request_timeout_s} s")
            return None
