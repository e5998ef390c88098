"""Tied embeddings cut into stages: the first stage's token embedding and the last stage's output head are one matrix,
of which each holds a copy that must stay equal, as Megatron-LM's first and last pipeline stages do (they all-reduce
the word embeddings' gradients over their "embedding group": megatron/core/distributed/finalize_model_grads.py).

After a step's stage all-reduces, every member of the first stage holds its stage's average gradient of the matrix,
A_e, and every member of the last stage A_h (equal bits within each stage). One more all-reduce over those 2·d_dp
members, a plain mean in fp32 whatever the plan's aggregation and codec (and without the norm bound between parts,
which assumes one kind of gradient), gives every one of them (A_e + A_h) / 2 with the same bits; doubled (exact in
floating point) that is the gradient of the tied matrix, A_e + A_h, as the single-process model takes it. Both
copies then take the same AdamW step from the same state and stay equal. A failure of this round fails the attempt
as a stage all-reduce's does (PartialAllReduce), so no copy moves alone.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
from hivemind.p2p import P2P, PeerID

from hetswarm.client.training.group_allreduce import StageGroup
from hetswarm.client.training.model import EMBEDDING_MATRIX, HEAD_MATRIX, StageModule
from hetswarm.protocol.keys import tied_namespace
from hetswarm.protocol.stage_role import StageRole

__all__ = ["TiedMatrix"]


class TiedMatrix:
    """This peer's copy of a tied embedding matrix, and the group of every peer that holds one."""

    def __init__(self, group: StageGroup, index: int) -> None:
        self.group = group
        self.index = index
        """Where the matrix is among the stage's parameters (and its gradients)."""

    @classmethod
    def of_role(cls, module: StageModule, role: StageRole, *, p2p: P2P, swarm: str, sender_timeout_s: float,
                reducer_timeout_s: float) -> TiedMatrix | None:
        """This peer's part in keeping the copies equal; None when it holds no copy that another stage holds too."""
        if not (module.config.tie_embeddings and role.d_pp > 1 and (module.is_first or module.is_last)):
            return None
        holders = [PeerID.from_base58(peer) for peer in role.tied_holders]
        group = StageGroup(p2p, holders, namespace=tied_namespace(swarm),
                           round_tag=f"{swarm}/v{role.version}/tied", sender_timeout_s=sender_timeout_s,
                           reducer_timeout_s=reducer_timeout_s,
                           part_norm_ratio=None)  # two different gradients by design: no bound between them
        names = [name for name, _ in module.named_parameters()]
        return cls(group, names.index(EMBEDDING_MATRIX if module.is_first else HEAD_MATRIX))

    @property
    def members(self) -> list[PeerID]:
        return self.group.members

    async def attach(self) -> None:
        await self.group.attach()

    async def detach(self) -> None:
        await self.group.detach()

    async def sum(self, grads: Sequence[torch.Tensor], *, step: int, attempt: int) -> None:
        """Makes this copy's gradient (in `grads`, the stage's averaged ones) the tied matrix's, on every copy alike.

        Raises:
            PartialAllReduce: a holder failed or stayed silent; the gradient is left as it was.
        """
        grad = grads[self.index]
        await self.group.average([grad], step=step, attempt=attempt)
        grad.mul_(2)
