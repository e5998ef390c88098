"""The swarm's held-out loss, read from its pipelines' Progress records and believed only where they agree.

Every pipeline measures the same held-out windows (client/training/data.py, TokenSource.held_out_batch) on weights
that its stage groups keep bit-identical (client/training/group_allreduce.py), so honest pipelines report the same
loss, up to the rounding of their devices. A member's word is not evidence: the swarm's figure is the one that the
most last-stage members report alike (within AGREEMENT, relative), and it is corroborated when two or more do; a
plan of one pipeline has no second witness, and its figure is shown as that pipeline's own word.
"""
from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass

from hetswarm.protocol.records import Assignment, Progress

__all__ = ["AGREEMENT", "HeldOut", "swarm_held_out"]

AGREEMENT = 1e-3
"""Relative difference within which two pipelines' held-out losses count as the same measurement (fp32 on CPU
gives equal bits; bf16 on mixed GPUs rounds differently)."""


@dataclass(frozen=True, slots=True)
class HeldOut:
    """The newest held-out loss of a plan and how many of its pipelines vouch for it."""

    step: int
    """The step after which it was measured."""
    loss: float
    agreeing: int
    """Last-stage members whose loss for `step` is `loss`, within AGREEMENT."""
    reported: int
    """Last-stage members that reported a loss for `step`."""

    @property
    def corroborated(self) -> bool:
        return self.agreeing >= 2

    def describe(self) -> str:
        witnesses = (f"{self.agreeing} of {self.reported} pipelines agree" if self.corroborated
                     else "one pipeline's word, not corroborated")
        return f"held-out loss {self.loss:.3f} after step {self.step} ({witnesses})"


def swarm_held_out(plan: Assignment, progress: Mapping[str, Progress]) -> HeldOut | None:
    """The newest step's held-out loss that the most last-stage members of `plan` agree on; None before any."""
    last_stages = {chain[-1] for chain in plan.pipelines}
    reports = [(record.held_out_step, record.held_out_loss) for signer, record in progress.items()
               if signer == record.peer_id and signer in last_stages and record.assignment_version == plan.version
               and record.held_out_step is not None and record.held_out_loss is not None]
    if not reports:
        return None
    step = max(step for step, _ in reports)
    losses = [loss for at, loss in reports if at == step]
    groups = [[other for other in losses if _agree(loss, other)] for loss in losses]
    witnesses = max(groups, key=lambda group: (len(group), -statistics.median(group)))
    return HeldOut(step=step, loss=statistics.median(witnesses), agreeing=len(witnesses), reported=len(losses))


def _agree(a: float, b: float) -> bool:
    return abs(a - b) <= AGREEMENT * max(abs(a), abs(b))
