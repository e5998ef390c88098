"""Replica consistency: the replicas of a stage hold the same parameters and optimizer state, or are made to.

After a committed step that calls for it (every ``StageConfig.check_every`` steps, and after any step that needed a
retry: the same steps on every peer, since commit decisions are the same everywhere), each replica hashes its
parameters and optimizer state (SHA-256 of their deterministic encoding), keeps that encoding, and asks every other
replica of its stage for its hash of the same step (``rpc_digest``). The chosen state is the hash held by the most
replicas, ties broken by a lottery drawn from the plan, the step and the replicas' ids, which no replica can rig
(stage_state.majority_digest); all replicas choose the same one. A replica whose hash differs loads the chosen state
from a replica holding it (``rpc_state``, streamed in 1 MiB parts), checks that what came has the chosen hash (else
it asks the next holder, and keeps its own state when none sends it), logs a warning and counts a resync. The state
and its hash are those of client/training/stage_state.py.

Replicas cannot drift while checking: a replica that has checked step N may start step N + 1, but cannot apply
it before every member has voted, so its state (and its snapshot) is still that of step N when asked.
"""
import asyncio
import hashlib
import logging
from collections.abc import Sequence
from typing import AsyncIterator

import torch
from hivemind.p2p import P2P, P2PContext, PeerID, ServicerBase
from hivemind.proto import runtime_pb2

from hetswarm.client.peer.served import Served
from hetswarm.client.training.stage_state import StageState, byte_parts, decode_tensors, majority_digest
from hetswarm.protocol.errors import RejectedInput
from hetswarm.protocol.rpc_messages import StepQuery, encode_message, read_message

__all__ = ["ReplicaSync", "check_salt"]

logger = logging.getLogger(__name__)



def check_salt(round_tag: str, step: int) -> str:
    """What salts the tie-break of the check after `step` (stage_state.majority_digest)."""
    return f"{round_tag}/replicas after step {step}"


class ReplicaSync(Served, ServicerBase):
    """Compares this replica's state with the other replicas of its stage, and repairs it when it differs."""

    def __init__(self, p2p: P2P, members: Sequence[PeerID], module: torch.nn.Module,
                 optimizer: torch.optim.Optimizer, *, namespace: str, round_tag: str, timeout_s: float) -> None:
        """
        Args:
            round_tag: names the plan and the stage (as StageGroup's): with the step, it salts the tie-break.
        """
        self.p2p, self.namespace, self.round_tag, self.timeout_s = p2p, namespace, round_tag, timeout_s
        self.members = sorted(members, key=lambda peer: peer.to_bytes())
        self.module, self.optimizer = module, optimizer
        self._checked: dict[int, tuple[bytes, bytes]] = {}  # step -> (digest, encoded state)
        self._changed = asyncio.Event()


    async def check(self, step: int) -> bool:
        """Compares states after ``step`` with the other replicas; returns True when this one was resynchronised."""
        if len(self.members) == 1:
            return False
        self._checked = {step: await asyncio.to_thread(self._snapshot)}
        self._changed.set()
        mine = self._checked[step][0]
        others = [peer for peer in self.members if peer != self.p2p.peer_id]
        answers = await asyncio.gather(*(self._digest_of(peer, step) for peer in others))
        if any(answer is None for answer in answers):
            logger.warning(f"Replica check of step {step} skipped: not every replica told its state hash")
            return False
        holders = dict(zip(others, answers)) | {self.p2p.peer_id: mine}
        chosen = majority_digest({peer.to_base58(): digest for peer, digest in holders.items()},
                                 salt=check_salt(self.round_tag, step))
        if chosen == mine:
            return False
        sources = [peer for peer in self.members if holders[peer] == chosen]
        logger.warning(f"Replica state after step {step} differs from {len(sources)} of {len(self.members)} "
                       f"replicas; resynchronising")
        for source in sources:
            if await self._load_from(source, step, chosen):
                return True
        logger.warning(f"No replica sent the state after step {step} that it reported; keeping this one")
        return False

    def _snapshot(self) -> tuple[bytes, bytes]:
        encoded = StageState.capture(self.module, self.optimizer, step=0).encode()
        return hashlib.sha256(encoded).digest(), encoded

    async def _digest_of(self, peer: PeerID, step: int) -> bytes | None:
        stub = ReplicaSync.get_stub(self.p2p, peer, namespace=self.namespace)
        try:
            response = await stub.rpc_digest(runtime_pb2.ExpertRequest(metadata=encode_message(StepQuery(step=step))),
                                             timeout=self.timeout_s)
        except Exception as e:
            logger.debug(f"No state hash from {peer}: {e!r}", exc_info=True)
            return None
        return response.metadata or None

    async def _load_from(self, peer: PeerID, step: int, digest: bytes) -> bool:
        """Loads `peer`'s state after `step` if it has the `digest` it reported; False (and why, logged) if not."""
        stub = ReplicaSync.get_stub(self.p2p, peer, namespace=self.namespace)
        parts = []
        try:
            async with asyncio.timeout(self.timeout_s):
                async for part in await stub.rpc_state(runtime_pb2.ExpertRequest(metadata=encode_message(StepQuery(step=step)))):
                    parts.append(part.metadata)
        except Exception as e:
            logger.warning(f"{peer} did not send its state after step {step}: {e!r}")
            return False
        blob = b"".join(parts)
        if (got := hashlib.sha256(blob).digest()) != digest:
            logger.warning(f"{peer} sent a state after step {step} that is not the one it reported (SHA-256 "
                           f"{got.hex()[:12]}…, reported {digest.hex()[:12]}…)")
            return False
        StageState(step + 1, decode_tensors(blob)).apply(self.module, self.optimizer)
        return True

    async def _checked_state(self, request: runtime_pb2.ExpertRequest, context: P2PContext
                             ) -> tuple[bytes, bytes] | None:
        if context.remote_id not in self.members:
            return None
        try:
            step = read_message(StepQuery, request.metadata).step
        except RejectedInput as e:
            logger.info(f"Refused a state question from {context.remote_id}: {e}")
            return None
        try:
            async with asyncio.timeout(self.timeout_s):
                while step not in self._checked:
                    self._changed.clear()
                    await self._changed.wait()
        except TimeoutError:
            return None
        return self._checked[step]

    async def rpc_digest(self, request: runtime_pb2.ExpertRequest, context: P2PContext
                         ) -> runtime_pb2.ExpertResponse:
        checked = await self._checked_state(request, context)
        return runtime_pb2.ExpertResponse(metadata=checked[0] if checked else b"")

    async def rpc_state(self, request: runtime_pb2.ExpertRequest, context: P2PContext
                        ) -> AsyncIterator[runtime_pb2.ExpertResponse]:
        checked = await self._checked_state(request, context)
        if checked is None:
            return
        snapshot = checked[1]
        for part in byte_parts(snapshot):
            yield runtime_pb2.ExpertResponse(metadata=part)
