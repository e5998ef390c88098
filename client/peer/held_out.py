"""The swarm's held-out loss, read from its pipelines' Progress records and believed only where they agree.

Every pipeline measures the same held-out windows (client/training/data.py, TokenSource.held_out_batch) on weights
that its stage groups keep bit-identical (client/training/exact_allreduce.py), so honest pipelines report the same
loss, up to the rounding of their devices. A member's word is not evidence: a report counts only from a last-stage
member of the plan, for a step the plan evaluates and the member has reached; the swarm's figure is the newest that
two or more pipelines report alike (within AGREEMENT, relative), which no single member can hide by claiming a
later step. Without such a figure, the newest step's is shown for what it is: one pipeline's word (a plan of one
pipeline has no second witness), or contested when as many pipelines say otherwise.
"""
from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass

from hetswarm.protocol.records import Assignment, Progress

__all__ = ["AGREEMENT", "HeldOut", "swarm_held_out"]

AGREEMENT = 1e-3
"""Relative difference within which two pipelines' held-out losses count as the same measurement (fp32 on CPU
gives equal bits; bf16 on mixed GPUs rounds differently)."""


@dataclass(frozen=True, slots=True)
class HeldOut:
    """A held-out loss of a plan and how many of its pipelines vouch for it."""

    step: int
    """The step after which it was measured."""
    loss: float
    agreeing: int
    """Last-stage members whose loss for `step` is `loss`, within AGREEMENT."""
    reported: int
    """Last-stage members that reported a loss for `step`."""
    contested: bool = False
    """As many other members report a different loss for `step`."""

    @property
    def corroborated(self) -> bool:
        return self.agreeing >= 2 and not self.contested

    def describe(self) -> str:
        if self.contested:
            witnesses = f"contested: the {self.reported} pipelines that reported disagree"
        elif self.corroborated:
            witnesses = f"{self.agreeing} of {self.reported} pipelines agree"
        else:
            witnesses = "one pipeline's word, not corroborated"
        return f"held-out loss {self.loss:.3f} after step {self.step} ({witnesses})"


def swarm_held_out(plan: Assignment, progress: Mapping[str, Progress]) -> HeldOut | None:
    """The newest held-out loss that two or more last-stage members of `plan` agree on; else the newest step's, not
    corroborated; None before any report (module docstring)."""
    last_stages = {chain[-1] for chain in plan.pipelines}
    by_step: dict[int, list[float]] = defaultdict(list)
    for signer, record in progress.items():
        step = record.held_out_step
        if (signer == record.peer_id and signer in last_stages and record.assignment_version == plan.version
                and step is not None and record.held_out_loss is not None and step <= record.step
                and plan.eval_every and (step + 1) % plan.eval_every == 0):
            by_step[step].append(record.held_out_loss)
    weighed = [_weigh(step, by_step[step]) for step in sorted(by_step, reverse=True)]
    return next((held_out for held_out in weighed if held_out.corroborated), weighed[0] if weighed else None)


def _weigh(step: int, losses: list[float]) -> HeldOut:
    """The loss the most of `losses` agree on; contested when another group of as many says otherwise."""
    groups = [[other for other in losses if _agree(loss, other)] for loss in losses]
    size = max(len(group) for group in groups)
    figures = [statistics.median(group) for group in groups if len(group) == size]
    contested = any(not _agree(figure, figures[0]) for figure in figures)
    return HeldOut(step=step, loss=figures[0], agreeing=size, reported=len(losses), contested=contested)


def _agree(a: float, b: float) -> bool:
    return abs(a - b) <= AGREEMENT * max(abs(a), abs(b))
