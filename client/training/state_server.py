"""What a peer hands off: the states it holds, served for as long as it runs (client/training/state_handoff.py takes
them).

``StateStore`` keeps the last two committed states of the stage this peer trains, those of the stage it trained
before (a peer that moves away keeps serving its old stage until it moves again), and its checkpoints. Two states,
because the peers of a plan may be one step apart when it ends (steps are all-or-nothing, but a peer applies a step as
soon as it has every vote, client/training/step_commit.py), and the next plan starts at the lower of their steps
(coordinator/run_state.py, ``start_step``). ``StateServer`` answers which units it holds at a step, with their hash
and size, streams a unit in 1 MiB parts, and says the newest step it holds; within per-peer limits
(client/peer/peer_gate.py).
"""
from __future__ import annotations

import asyncio
import hashlib
import logging
from collections import Counter
from collections.abc import Sequence
from typing import AsyncIterator  # hivemind's ServicerBase recognises streams by typing.AsyncIterator only

from hivemind.p2p import P2P, P2PContext, ServicerBase
from hivemind.proto import runtime_pb2

from hetswarm.client.peer.peer_gate import PeerGate
from hetswarm.client.peer.served import Served
from hetswarm.client.training.checkpoints import CheckpointDir
from hetswarm.client.training.stage_state import StageState, byte_parts, merged
from hetswarm.protocol.errors import RejectedInput
from hetswarm.protocol.keys import ReadyStep
from hetswarm.protocol.rpc_messages import (
    HeldUnit,
    NewestState,
    StateInfo,
    StateInfoRequest,
    UnitRequest,
    encode_message,
    read_message,
)

__all__ = ["StateServer", "StateStore"]

logger = logging.getLogger(__name__)

_STATES_PER_STAGE = 2
_STAGES_KEPT = 2
_CONCURRENT_UPLOADS = 4


class StateStore:
    """The states this peer can hand off (module docstring); newest first."""

    def __init__(self, checkpoints: CheckpointDir | None = None) -> None:
        self.checkpoints = checkpoints
        self._states: list[StageState] = []
        self.version = 0
        """The plan version this peer has switched to: once it is at a version, its states of older plans are
        final (the old plan cannot commit a step without it)."""

    @property
    def newest_step(self) -> int | None:
        """The step of the newest state held in memory (of the stage trained last)."""
        return self._states[0].step if self._states else None

    def remember(self, state: StageState) -> None:
        """Keeps ``state`` (a copy nobody changes any more) and forgets what the bounds leave out."""
        kept, per_stage = [state], Counter({tuple(state.units): 1})
        for old in self._states:
            key = tuple(old.units)
            if old.step == state.step and key == tuple(state.units):
                continue
            if per_stage[key] < _STATES_PER_STAGE and (key in per_stage or len(per_stage) < _STAGES_KEPT):
                per_stage[key] += 1
                kept.append(old)
        self._states = kept

    def forget_after(self, step: ReadyStep) -> None:
        """Drops the states of steps after ``step`` from memory: a plan went back to it, and they belong to the
        trajectory it abandoned (the coordinator no longer resumes from their checkpoints either)."""
        self._states = [state for state in self._states if state.step <= step]

    def find_part(self, step: ReadyStep, units: Sequence[str]) -> StageState | None:
        """Those of ``units`` this peer holds for ``step``, from memory and else from checkpoints (blocking: disk);
        None when it holds none. A plan that cuts the layers anew leaves a peer part of its new stage."""
        part, missing = None, set(units)
        for state in self._states:
            if state.step == step and (held := missing & set(state.units)):
                part, missing = merged(part, state.select(sorted(held))), missing - held
        if missing and self.checkpoints is not None:
            part = merged(part, self.checkpoints.find_part(step, sorted(missing)))
        return part


class StateServer(Served, ServicerBase):
    """Serves a StateStore to any peer of the swarm (the state is the swarm's model, not a secret), at most
    ``_CONCURRENT_UPLOADS`` units at a time, and within per-peer limits (client/peer/peer_gate.py): a question may
    make us read a checkpoint from disk, so nobody may ask without end."""

    def __init__(self, p2p: P2P, store: StateStore, *, namespace: str) -> None:
        self.p2p, self.store, self.namespace = p2p, store, namespace
        self._encoded: dict[tuple[int, str], tuple[bytes, str]] = {}
        self._uploads = asyncio.Semaphore(_CONCURRENT_UPLOADS)
        self.questions = PeerGate(name="state question", max_concurrent=2, per_s=2.0, burst=32)
        self.downloads = PeerGate(name="state download", max_concurrent=_CONCURRENT_UPLOADS, per_s=10.0, burst=256)

    async def _encodings(self, step: int, units: list[str]) -> dict[str, tuple[bytes, str]]:
        """(encoding, SHA-256 hex) of each of ``units`` held at ``step``; one lookup for them all (a checkpoint is
        read and checked once), cached for the step."""
        if any(cached_step != step for cached_step, _ in self._encoded):
            self._encoded.clear()  # one step's encodings at a time
        wanted = [unit for unit in units if (step, unit) not in self._encoded]
        found = await asyncio.to_thread(self.store.find_part, step, wanted) if wanted else None
        if found is not None:
            for unit in found.units:
                blob = await asyncio.to_thread(found.select([unit]).encode)
                self._encoded[step, unit] = (blob, hashlib.sha256(blob).hexdigest())
        return {unit: self._encoded[step, unit] for unit in units if (step, unit) in self._encoded}

    async def rpc_state_info(self, request: runtime_pb2.ExpertRequest, context: P2PContext
                             ) -> runtime_pb2.ExpertResponse:
        with self.questions.enter(context.remote_id.to_base58()) as refused:
            return runtime_pb2.ExpertResponse() if refused else await self._info(request, context)

    async def _info(self, request: runtime_pb2.ExpertRequest, context: P2PContext) -> runtime_pb2.ExpertResponse:
        try:
            asked = read_message(StateInfoRequest, request.metadata)
        except RejectedInput as e:
            logger.info(f"Refused a state request from {context.remote_id}: {e}")
            return runtime_pb2.ExpertResponse()
        held = {unit: HeldUnit(digest=digest, size=len(blob))
                for unit, (blob, digest) in (await self._encodings(asked.step, list(asked.units))).items()}
        return runtime_pb2.ExpertResponse(metadata=encode_message(StateInfo(held=held)))

    async def rpc_state_newest(self, request: runtime_pb2.ExpertRequest, context: P2PContext
                               ) -> runtime_pb2.ExpertResponse:
        return runtime_pb2.ExpertResponse(metadata=encode_message(
            NewestState(version=self.store.version, newest=self.store.newest_step)))

    async def rpc_state_unit(self, request: runtime_pb2.ExpertRequest, context: P2PContext
                             ) -> AsyncIterator[runtime_pb2.ExpertResponse]:
        try:
            asked = read_message(UnitRequest, request.metadata)
        except RejectedInput as e:
            logger.info(f"Refused a state request from {context.remote_id}: {e}")
            return
        step, unit, digest = asked.step, asked.unit, asked.digest
        with self.downloads.enter(context.remote_id.to_base58()) as refused:
            if refused:
                return
            async with self._uploads:
                held = (await self._encodings(step, [unit])).get(unit)
                if held is None or held[1] != digest:
                    ours = "none" if held is None else f"digest {held[1][:12]}"
                    logger.info(f"{context.remote_id} asked for {unit} of step {step} with digest {digest[:12]}; "
                                f"we hold {ours}, so we send nothing")
                    return
                for part in byte_parts(held[0][asked.offset:]):
                    yield runtime_pb2.ExpertResponse(metadata=part)
