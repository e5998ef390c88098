"""CenteredClip: an average that a minority of arbitrary contributions can move only a bounded distance.

Karimireddy, He and Jaggi, "Learning from History for Byzantine Robust Optimization" (ICML 2021), and Gorbunov et
al., "Secure Distributed Training at Scale" (ICML 2022, the hivemind authors' Byzantine-tolerant all-reduce), use
it as the aggregation rule: start from a robust centre and move it, a few times, by the mean of every contribution's
offset clipped to a radius tau. A contribution inside the radius counts fully; one far away moves the centre by at
most tau / n per iteration, however far it is. Here the centre starts at the coordinate-wise median, and tau is
`radius_factor` times the median distance of the contributions from it, so it scales with the gradients.

In the stage group's all-reduce, each reducer applies it to the senders' versions of each of its parts
(client/training/exact_allreduce.py); a plan chooses it with `hetswarm coordinator --aggregation centered-clip`.
With honest replicas only, it differs from the mean (and so from the single-process reference) by the clipping of
the contributions farthest from the centre: it is for open swarms, off by default.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["centered_clip"]


def centered_clip(parts: Sequence[torch.Tensor], *, iterations: int = 3, radius_factor: float = 2.0) -> torch.Tensor:
    """The CenteredClip aggregate of `parts` (one tensor per contributor, all of one shape)."""
    stacked = torch.stack([part.float() for part in parts])
    if len(parts) <= 2:
        return stacked.mean(0).to(parts[0].dtype)  # with two, no majority can tell the honest one
    centre = stacked.median(dim=0).values
    distances = (stacked - centre).flatten(1).norm(dim=1)
    tau = radius_factor * float(distances.median()) + 1e-12
    for _ in range(iterations):
        offsets = stacked - centre
        norms = offsets.flatten(1).norm(dim=1).clamp_min(1e-12)
        scale = (tau / norms).clamp(max=1.0).view(-1, *([1] * (stacked.dim() - 1)))
        centre = centre + (offsets * scale).mean(0)
    return centre.to(parts[0].dtype)
