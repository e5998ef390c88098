"""How large a gradient part, or an average of parts, may honestly be in a stage group's all-reduce round.

Replicas of one stage compute gradients of one model on batches of one size, so honest parts differ by far less than
MAX_PART_NORM_RATIO: a sender's part with a NaN or an infinity, or a norm over that ratio times this member's own
part (or, for a part that is all zeros here, its parts' mean norm), is refused. An average is no longer than its
longest part and a reducer takes no part over the ratio times its own, so an honest average is finite and within the
square of the ratio of the part this member sent it. A NaN or a scaled average is caught; a wrong one within the
bound is the audit's to catch (client/training/reduction_audit.py).
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import torch

__all__ = ["MAX_PART_NORM_RATIO", "PartBounds"]

MAX_PART_NORM_RATIO = 1000.0
"""How much larger than this member's own a sender's gradient part may be."""


class PartBounds:
    """The bounds of one round, from the parts this member sends each reducer (module docstring)."""

    def __init__(self, sent: Sequence[Sequence[tuple[torch.Tensor, object]]], *, own_index: int,
                 ratio: float | None = MAX_PART_NORM_RATIO) -> None:
        """
        Args:
            sent: reducer index → this member's parts for it, as (part, info) (the runner's `sent_parts`).
            own_index: this member's index among the reducers.
            ratio: how much larger than this member's own a sender's part may be; None: no bound (a group whose
                members hold different gradients by design: client/training/tied_embeddings.py).
        """
        self.ratio = ratio
        self._shapes = [[part.shape for part, _ in parts] for parts in sent]
        self._norms = [[float(part.norm()) for part, _ in parts] for parts in sent]
        every = [norm for norms in self._norms for norm in norms]
        self._mean_norm = sum(every) / max(len(every), 1)
        self._own = self._norms[own_index]  # the parts this member reduces

    def part_refusal(self, part: torch.Tensor, part_index: int) -> str | None:
        """Why a sender's part `part_index` of this member's share is refused, or None."""
        norm = float(part.norm())  # one pass: not finite when a value is not (or past float range: refused anyway)
        if not math.isfinite(norm):
            return "NaN or infinite values"
        if self.ratio is None or part_index >= len(self._own):
            return None
        if norm > self.ratio * max(self._own[part_index], sum(self._own) / max(len(self._own), 1), 1e-12):
            return f"a norm of {norm:.3g}, over {self.ratio:g}× this member's own"
        return None

    def average_refusal(self, averaged: torch.Tensor, peer_index: int, part_index: int) -> str | None:
        """Why an average reducer `peer_index` sent of part `part_index` cannot be the reduction of honest parts, or
        None."""
        norm = float(averaged.norm())
        if not math.isfinite(norm):
            return "NaN or infinite values"
        bound = self.sent_part_bound(peer_index, part_index)
        if bound is not None and norm > self.ratio * bound:
            return f"a norm of {norm:.3g}, over {self.ratio ** 2:g}× the part we sent it"
        return None

    def sent_part_bound(self, peer_index: int, part_index: int) -> float | None:
        """The largest norm the reducer `peer_index` takes for its part `part_index` from a sender, as far as this
        member can tell: the bound relative to the part this member sent it (or our parts' mean norm, for a part
        that is all zeros here); None: no bound."""
        if self.ratio is None:
            return None
        return self.ratio * max(self._norms[peer_index][part_index], self._mean_norm, 1e-12)

    def sent_shape(self, peer_index: int, part_index: int) -> torch.Size:
        return self._shapes[peer_index][part_index]
