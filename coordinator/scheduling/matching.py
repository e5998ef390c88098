"""Bottleneck perfect matching: pair two stage groups' devices so that the slowest pair is as fast as possible.

DT-FM's coarsened graph weighs the edge between stage groups C_j and C_k with
min over bijections pi of max over d of tau(d, pi(d)) (docs/dtfm.md, Cost model). The reference solves it with up
to k^2 full assignment solves and hands out the last *infeasible* assignment; here a threshold search over the
sorted distinct weights asks only "is there a perfect matching using edges <= t?" (Hopcroft–Karp in scipy), and
the assignment returned is the one found at the optimal threshold, so it achieves the bottleneck.
"""
from __future__ import annotations

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import maximum_bipartite_matching

__all__ = ["bottleneck_matching"]

_SMALL = 16
"""Up to this many devices per group, Kuhn's algorithm on Python ints beats building scipy sparse matrices."""


def bottleneck_matching(weights: np.ndarray) -> tuple[float, np.ndarray]:
    """The bottleneck value of a square weight matrix and an assignment that achieves it.

    Args:
        weights: (k, k) time of the link from row device i to column device j.

    Returns:
        (bottleneck, assignment): assignment[i] is the column matched to row i, and
        max_i weights[i, assignment[i]] == bottleneck, the least possible over all bijections.
    """
    weights = np.asarray(weights, dtype=float)
    k = weights.shape[0]
    if weights.shape != (k, k) or k == 0:
        raise ValueError(f"bottleneck matching needs a non-empty square matrix, got shape {weights.shape}")
    # Every row and every column needs one edge: no threshold below the largest row/column minimum can work.
    lower_bound = max(weights.min(axis=1).max(), weights.min(axis=0).max())
    thresholds = np.unique(weights[weights >= lower_bound])  # sorted; the largest always admits a matching
    if k <= _SMALL:
        return _ascending_search(weights, thresholds)
    return _binary_search(weights, thresholds)


def _ascending_search(weights: np.ndarray, thresholds: np.ndarray) -> tuple[float, np.ndarray]:
    """Raises the threshold one distinct weight at a time, growing one matching by augmenting paths (Kuhn).

    Edges only ever get added, so the matching carries over; the answer is usually the lower bound or just above.
    """
    k = len(weights)
    bits = 1 << np.arange(k, dtype=np.int64)
    row_of_column = [-1] * k
    free_rows = list(range(k))
    for threshold in thresholds:
        rows = [int(mask) for mask in (weights <= threshold).astype(np.int64) @ bits]
        free_rows = [row for row in free_rows if not _augment(rows, row_of_column, row, 0)[0]]
        if not free_rows:
            assignment = np.empty(k, dtype=np.int64)
            assignment[row_of_column] = np.arange(k)
            return float(threshold), assignment
    raise AssertionError("the complete bipartite graph always has a perfect matching")


def _augment(rows: list[int], row_of_column: list[int], row: int, seen: int) -> tuple[bool, int]:
    """Kuhn's augmenting path from `row` over bitmask adjacency; `seen` marks columns already explored."""
    free = rows[row] & ~seen
    while free:
        column = (free & -free).bit_length() - 1
        free &= free - 1
        seen |= 1 << column
        if row_of_column[column] < 0:
            row_of_column[column] = row
            return True, seen
        found, seen = _augment(rows, row_of_column, row_of_column[column], seen)
        if found:
            row_of_column[column] = row
            return True, seen
    return False, seen


def _binary_search(weights: np.ndarray, thresholds: np.ndarray) -> tuple[float, np.ndarray]:
    """Binary search over thresholds with scipy's Hopcroft–Karp as the feasibility check, for large groups."""
    low, high = 0, len(thresholds) - 1
    best = _perfect_matching(weights <= thresholds[low])
    if best is not None:
        return float(thresholds[low]), best
    best = _perfect_matching(weights <= thresholds[high])
    while high - low > 1:  # invariant: thresholds[low] infeasible, thresholds[high] feasible
        middle = (low + high) // 2
        found = _perfect_matching(weights <= thresholds[middle])
        if found is None:
            low = middle
        else:
            high, best = middle, found
    assert best is not None, "the complete bipartite graph always has a perfect matching"
    return float(thresholds[high]), best


def _perfect_matching(allowed: np.ndarray) -> np.ndarray | None:
    """Row → column of a perfect matching using only allowed edges, or None if there is none."""
    if not (allowed.any(axis=1).all() and allowed.any(axis=0).all()):
        return None
    assignment = maximum_bipartite_matching(csr_matrix(allowed), perm_type="column")
    return None if (assignment < 0).any() else assignment
