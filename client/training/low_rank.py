"""A stage group's low-rank all-reduce: PowerSGD (Vogels et al. 2019, "PowerSGD: Practical Low-Rank Gradient
Compression for Distributed Optimization", Algorithm 1, with error feedback), in two rounds (group_allreduce.py).

Each gradient matrix M (a tensor of two or more dimensions, seen as rows × the rest) travels as two thin factors of
a rank r chosen so that they hold the wire's share of M's values (`factor_rank`). With Q (columns × r) held alike by
every member:
  1. each member sends P_i = M_i·Q̂, Q̂ an orthonormal basis of Q's columns (`orthonormal`); the group averages them,
     and every member takes P̂, an orthonormal basis of the average's columns;
  2. each member sends Q_i = M_iᵀ·P̂; the group averages them into Q̄;
and every member applies P̂·Q̄ᵀ. Q̄ is the next step's Q (one power iteration per step, warm-started as the paper
does); the first step draws Q at random, alike on every member, from the round tag. Vectors, and matrices whose
factors would be no smaller, travel whole in round 1.

Both factors travel transposed, a column after another, so that a block of the 8-bit codec (protocol/codecs.py)
holds one column's values and gets its scale. A column's size follows its singular value, and within a block
scaled by the first column's the last columns' values would round away. For the same reason P is taken from Q̂,
not from Q̄ itself, whose columns would make P's sizes the singular values squared. On the tiny model, 300 steps,
factors of 1/4 in 8 bits ended 7.8 % above the full gradient's loss sent row after row from Q̄, 3.3 % sent column
after column, and 2.5 % with P from Q̂ too (benchmarks/gradient_options.py).

Replicas stay bit-identical: every member computes P̂ and P̂·Q̄ᵀ from the same decoded averages with the same
operations (on CPUs of one kind; replica_sync.py resynchronises a replica that rounds otherwise).

Error feedback. A member's residual of a factored matrix is M_i − P̂·Q_iᵀ, plus P̂ times what the codec cut from
its Q_i on the way to its reducer and, n times over, from the averages of Q it reduced itself (as a sparse round's,
group_allreduce.py). Over the n members their mean is mean(M) − P̂·Q̄ᵀ: exactly what the group did not apply. A
member's residual is what its own matrix has outside the shared basis; its distance from the group's average (the
residual torch's PowerSGD hook keeps) would grow step after step, as a random walk of the members' differences, and
widen every later 8-bit block.
"""
import hashlib
import math
from collections.abc import Callable, Sequence

import torch

__all__ = ["LowRankStep", "factor_rank", "orthonormal"]

_EPSILON = 1e-8
"""Added to a column's norm before it is divided by it (PowerSGD's): a zero column stays zero, not NaN."""


def factor_rank(shape: Sequence[int], share: float) -> int:
    """The rank of factors holding about `share` of a tensor of `shape`'s values: at least 1; 0 when the tensor
    travels whole (a vector, or a matrix whose factors would be no smaller)."""
    if len(shape) < 2:
        return 0
    rows, columns = shape[0], math.prod(shape[1:])
    rank = max(1, round(share * rows * columns / (rows + columns)))
    return rank if rank * (rows + columns) < rows * columns else 0


def orthonormal(p: torch.Tensor) -> torch.Tensor:
    """An orthonormal basis of `p`'s columns (a rows × r matrix), by modified Gram–Schmidt in float64."""
    basis = p.double().clone()
    for j in range(basis.shape[1]):
        column = basis[:, j]
        column /= column.norm() + _EPSILON
        basis[:, j + 1:] -= torch.outer(column, column @ basis[:, j + 1:])
    return basis.float()


class LowRankStep:
    """One member's step of the low-rank all-reduce of `tensors` (its gradients, residuals added): what it sends in
    each round, what it applies, and what it carries to the next step."""

    def __init__(self, tensors: Sequence[torch.Tensor], *, share: float, round_tag: str,
                 carried: Callable[[int, tuple[int, int]], torch.Tensor | None]) -> None:
        """
        Args:
            carried: tensor index, (columns, rank) → the Q̄ the last committed step left for that tensor, or None.
        """
        self.tensors = list(tensors)
        ranks = [factor_rank(tensor.shape, share) for tensor in self.tensors]
        self.factored = [index for index, rank in enumerate(ranks) if rank]
        self.whole = [index for index, rank in enumerate(ranks) if not rank]
        self.matrices = {index: tensor.reshape(tensor.shape[0], -1) for index, tensor in enumerate(self.tensors)
                         if index in self.factored}
        self.q = {}
        for index in self.factored:
            shape = (ranks[index], self.matrices[index].shape[1])  # Qᵀ
            q = carried(index, shape)
            self.q[index] = _drawn(round_tag, index, shape) if q is None else q
        self.p_hat: dict[int, torch.Tensor] = {}
        self.q_sent: dict[int, torch.Tensor] = {}

    def first_round(self) -> list[torch.Tensor]:
        """What round 1 sends: P_iᵀ of each factored matrix, then the whole tensors."""
        return [(self.matrices[index] @ orthonormal(self.q[index].T)).T.contiguous() for index in self.factored] + \
            [self.tensors[index] for index in self.whole]

    def second_round(self, first_averages: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """What round 2 sends, given round 1's averages: Q_iᵀ of each factored matrix."""
        for index, p in zip(self.factored, first_averages):
            self.p_hat[index] = orthonormal(p.T)
            self.q_sent[index] = self.p_hat[index].T @ self.matrices[index]
        return [self.q_sent[index] for index in self.factored]

    def averages(self, first_averages: Sequence[torch.Tensor], q_averages: Sequence[torch.Tensor]
                 ) -> list[torch.Tensor]:
        """The group's averages of `tensors`, the same bits on every member."""
        averages = dict(zip(self.whole, first_averages[len(self.factored):]))
        for index, q in zip(self.factored, q_averages):
            averages[index] = (self.p_hat[index] @ q).view_as(self.tensors[index])
        return [averages[index] for index in range(len(self.tensors))]

    def residuals(self, first_errors: Sequence[torch.Tensor], q_errors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Each tensor's residual for the next step (module docstring), given what the codec cut in each round from
        what this member sent and reduced (n times over) in it."""
        residuals = dict(zip(self.whole, first_errors[len(self.factored):]))
        for index, error in zip(self.factored, q_errors):
            applied = self.p_hat[index] @ (self.q_sent[index] - error)
            residuals[index] = (self.matrices[index] - applied).view_as(self.tensors[index])
        return [residuals[index] for index in range(len(self.tensors))]


def _drawn(round_tag: str, index: int, shape: tuple[int, int]) -> torch.Tensor:
    """The first step's Q of tensor `index`: standard normal, drawn alike by every member of the group."""
    seed = int.from_bytes(hashlib.sha256(f"{round_tag}/factor{index}".encode()).digest()[:8], "little")
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed >> 1))
