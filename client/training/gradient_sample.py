"""The blocks of a stage's gradient that a sparse all-reduce sends in one step (protocol/wire_format.py).

Every member of a stage group must send the same values' positions, and a retried step must send what its first
try sent (a retry starts from the same residuals and must end where a fault-free run ends). So the sample is drawn
from a generator seeded by the group's round tag and the step alone: no member sends indices, and none can choose
them. The gradient's tensors are taken as one flat vector, cut into blocks of SAMPLE_BLOCK_VALUES consecutive values
(the last one padded with zeros), of which a `density` share is drawn without replacement, kept in increasing order.
"""
import hashlib
import math
from collections.abc import Sequence

import torch

from hetswarm.protocol.wire_format import SAMPLE_BLOCK_VALUES

__all__ = ["GradientSample", "flatten", "unflatten"]


class GradientSample:
    """The blocks of one step's sample, and the moves between the flat gradient and the values sent."""

    def __init__(self, numel: int, *, density: float, round_tag: str, step: int) -> None:
        if not 0 < density <= 1:
            raise ValueError(f"a sample's density is in (0, 1], got {density}")
        self.numel, self.blocks = numel, -(-numel // SAMPLE_BLOCK_VALUES)
        seed = int.from_bytes(hashlib.sha256(f"{round_tag}/step{step}/sample".encode()).digest()[:8], "little")
        generator = torch.Generator().manual_seed(seed >> 1)  # manual_seed takes a signed 64-bit value
        drawn = torch.randperm(self.blocks, generator=generator)[:max(1, math.ceil(density * self.blocks))]
        self.chosen = drawn.sort().values

    @property
    def sent_values(self) -> int:
        return len(self.chosen) * SAMPLE_BLOCK_VALUES

    def gather(self, flat: torch.Tensor) -> torch.Tensor:
        """The values of the chosen blocks of `flat` (a float32 vector of `numel` values), block after block."""
        return self._blocked(flat)[self.chosen].reshape(-1)

    def scatter(self, values: torch.Tensor, into: torch.Tensor) -> torch.Tensor:
        """A copy of `into` (a vector of `numel` values) with its chosen blocks replaced by `values`, laid out as
        `gather` gives them."""
        blocked = self._blocked(into)
        blocked[self.chosen] = values.reshape(-1, SAMPLE_BLOCK_VALUES)
        return blocked.reshape(-1)[:self.numel]

    def _blocked(self, flat: torch.Tensor) -> torch.Tensor:
        padding = self.blocks * SAMPLE_BLOCK_VALUES - self.numel
        return torch.nn.functional.pad(flat.reshape(-1), (0, padding)).view(self.blocks, SAMPLE_BLOCK_VALUES)


def flatten(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    return torch.cat([tensor.reshape(-1) for tensor in tensors])


def unflatten(flat: torch.Tensor, like: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """`flat` cut back into tensors of the shapes of `like`."""
    return [part.view_as(tensor) for part, tensor in zip(flat.split([tensor.numel() for tensor in like]), like)]
