"""The coordinator's loop: read the peers' records, let the replanner decide, publish signed assignment versions.

The assignment lives under the swarm's `assignment` key, in the subkey signed by the coordinator's key, so that
clients pinned to that key can tell it from anyone else's (docs/hivemind.md, signed assignments). It is
republished every TTL/2 with expiry TTL; versions only grow, also across a restart with the same identity.
"""
from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

import hivemind
from hivemind.utils import get_dht_time
from hivemind.utils.crypto import RSAPrivateKey

from hetswarm.coordinator.planner import Proposal, Replanner
from hetswarm.protocol.keys import ASSIGNMENT_FIELD, PEERS_FIELD, PROGRESS_FIELD
from hetswarm.protocol.record_store import SwarmRecords
from hetswarm.protocol.records import Assignment, PeerRole
from hetswarm.protocol.errors import ConfigError

__all__ = ["BroadcastConfig", "Broadcaster", "build_assignment"]

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

    def __post_init__(self) -> None:
        if self.ttl_s < 2 or self.interval_s <= 0 or self.request_timeout_s <= 0:
            raise ConfigError(f"bad timing: ttl_s={self.ttl_s} (>= 2), interval_s={self.interval_s}, "
                             f"request_timeout_s={self.request_timeout_s}")


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
    def __init__(self, dht: hivemind.DHT, *, private_key: RSAPrivateKey, coordinator_id: str,
                 replanner: Replanner, config: BroadcastConfig):
        self.dht, self.private_key, self.coordinator_id = dht, private_key, coordinator_id
        self.records = SwarmRecords(dht, config.swarm, private_key=private_key, timeout_s=config.request_timeout_s)
        self.replanner, self.config = replanner, config
        self.assignment: Assignment | None = None
        self._published_at = -math.inf

    async def run(self, stop: asyncio.Event) -> None:
        """Plans and publishes until `stop` is set."""
        version = await self._previous_version()
        while not stop.is_set():
            records = await self._read(PEERS_FIELD)
            if records is not None:
                decision = await asyncio.to_thread(self.replanner.decide, records, time.monotonic())
                if decision is not None:
                    version += 1
                    await self._announce(*decision, version=version)
            if self.assignment is not None and time.monotonic() - self._published_at >= self.config.ttl_s / 2:
                await self._publish()
            try:
                await asyncio.wait_for(stop.wait(), timeout=self.config.interval_s)
            except TimeoutError:
                pass

    async def _announce(self, proposal: Proposal, reason: str, *, version: int) -> None:
        progress = await self._read(PROGRESS_FIELD) or {}
        step = max((p.step for p in progress.values()), default=self.assignment.step if self.assignment else 0)
        self.assignment = build_assignment(proposal, coordinator_id=self.coordinator_id, version=version,
                                           reason=reason, step=step)
        d_pp, d_dp = proposal.plan.grid.shape
        logger.info(f"Publishing v{version}: {d_dp} pipelines × {d_pp} stages, {len(proposal.standbys)} standby, "
                    f"predicted {proposal.live.total_s:.3f} s/step ({reason})")
        await self._publish()
        if self.config.save_plan is not None:
            _write_json(self.config.save_plan, proposal.to_dict() | {
                "version": version, "reason": reason, "coordinator_id": self.coordinator_id})

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

    async def _previous_version(self) -> int:
        """The version this coordinator published last (after a restart), so that versions keep growing."""
        ours = ((await self._read(ASSIGNMENT_FIELD)) or {}).get(self.coordinator_id)
        if ours is not None:
            logger.info(f"Found our assignment v{ours.version} in the swarm; continuing from it")
        return ours.version if ours is not None else 0


def _write_json(path: Path, data: dict) -> None:
    """Written whole or not at all: readers never see half a plan."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(data, indent=1))
    os.replace(partial, path)
