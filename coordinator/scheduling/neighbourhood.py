"""Candidates of the search and their swap neighbourhood, evaluated incrementally on the true objective.

A swap of two devices between groups a and b changes only the group terms of a and b and the rows a, b of the link
matrix; everything else is reused. Terms are cached on the evaluator's group keys (multisets of interchangeable
devices for the paper model), so a move that only relabels twins costs a dictionary look-up, and moves between two
twins are never tried at all.
"""
from __future__ import annotations

import time
from collections import Counter
from collections.abc import Hashable, Iterable
from dataclasses import dataclass

import numpy as np

from hetswarm.coordinator.scheduling.cost_model import CostBreakdown, CostEvaluator

__all__ = ["Candidate", "CachedEvaluator", "improve_by_swaps"]

_TOLERANCE_S = 1e-9


@dataclass(slots=True)
class Candidate:
    """A partition and everything its cost is made of; `score` orders candidates (cost, then smoothness)."""

    partition: np.ndarray
    """(d_pp, d_dp) device ids; row j is stage group C_j (in no particular stage order)."""
    keys: list[Hashable]
    group_times_s: np.ndarray
    """(d_pp,) group terms, or (d_pp, k) when the evaluator's group term is a row."""
    links_s: np.ndarray
    """(d_pp, d_pp) symmetric link matrix, zero diagonal."""
    smooth_s: np.ndarray
    """(d_pp, d_pp) the links' tie-breaking companions (CostEvaluator.link_terms_s)."""
    breakdown: CostBreakdown
    order: list[int]
    """Stage order: order[s] is the row of `partition` that runs stage s."""

    @property
    def cost_s(self) -> float:
        return self.breakdown.total_s

    @property
    def score(self) -> tuple[float, float]:
        """Cost first; ties broken by the sum of group terms and of the smooth link terms along the stage order,
        which move with single swaps where the max and the bottlenecks do not."""
        path_smooth = self.smooth_s[self.order[:-1], self.order[1:]].sum()
        return round(self.cost_s, 9), round(float(self.group_times_s.sum() + path_smooth), 9)

    def signature(self) -> frozenset[tuple[Hashable, int]]:
        """Equal for candidates that differ only by twins or by the labelling of groups."""
        return frozenset(Counter(self.keys).items())


class CachedEvaluator:
    """An evaluator with memoised group, link and combination terms; counts the candidates it costs."""

    def __init__(self, evaluator: CostEvaluator) -> None:
        self.evaluator = evaluator
        self.evaluations = 0
        self._groups: dict[Hashable, float | np.ndarray] = {}
        self._links: dict[tuple[Hashable, Hashable], tuple[float, float]] = {}
        self._combined: dict[bytes, tuple[CostBreakdown, list[int]]] = {}

    def group_time_s(self, key: Hashable, group: np.ndarray) -> float | np.ndarray:
        if (value := self._groups.get(key)) is None:
            value = self._groups[key] = self.evaluator.group_time_s(group)
        return value

    def link_terms_s(
        self, key_a: Hashable, group_a: np.ndarray, key_b: Hashable, group_b: np.ndarray
    ) -> tuple[float, float]:
        pair = (key_a, key_b) if hash(key_a) <= hash(key_b) else (key_b, key_a)  # links are direction-free
        if (value := self._links.get(pair)) is None:
            value = self._links[pair] = self.evaluator.link_terms_s(group_a, group_b)
        return value

    def _filled_links(self, partition: np.ndarray, keys: list[Hashable], links: np.ndarray, smooth: np.ndarray,
                      rows: Iterable[int]) -> None:
        for g in rows:
            for k in range(len(partition)):
                if k != g:
                    terms = self.link_terms_s(keys[g], partition[g], keys[k], partition[k])
                    (links[g, k], smooth[g, k]), (links[k, g], smooth[k, g]) = terms, terms

    def _bounded_links(self, partition: np.ndarray, links: np.ndarray, rows: Iterable[int]) -> None:
        """Fills rows of `links` with cheap lower bounds (exact weights follow only if the move may win)."""
        for g in rows:
            others = np.delete(np.arange(len(partition)), g)
            links[g, others] = links[others, g] = self.evaluator.link_bounds_s(partition[g], partition[others])

    def combine(self, group_times_s: np.ndarray, links_s: np.ndarray) -> tuple[CostBreakdown, list[int]]:
        self.evaluations += 1
        key = group_times_s.tobytes() + links_s.tobytes()
        if (value := self._combined.get(key)) is None:
            if len(self._combined) > 200_000:  # bound memory on long runs over large swarms
                self._combined.clear()
            value = self._combined[key] = self.evaluator.combine(group_times_s, links_s)
        return value

    def candidate(self, partition: np.ndarray) -> Candidate:
        """Costs a partition, reusing every cached term."""
        d_pp = len(partition)
        keys = [self.evaluator.group_key(group) for group in partition]
        times = np.array([self.group_time_s(k, g) for k, g in zip(keys, partition)])
        links, smooth = np.zeros((d_pp, d_pp)), np.zeros((d_pp, d_pp))
        self._filled_links(partition, keys, links, smooth, range(d_pp))
        breakdown, order = self.combine(times, links)
        return Candidate(partition=partition, keys=keys, group_times_s=times, links_s=links, smooth_s=smooth,
                         breakdown=breakdown, order=order)

    def swapped(self, base: Candidate, a: int, i: int, b: int, j: int) -> Candidate | None:
        """`base` with partition[a, i] and partition[b, j] exchanged, or None when it cannot beat `base`."""
        partition = base.partition.copy()
        partition[a, i], partition[b, j] = partition[b, j], partition[a, i]
        keys, times = list(base.keys), base.group_times_s.copy()
        for g in (a, b):
            keys[g] = self.evaluator.group_key(partition[g])
            times[g] = self.group_time_s(keys[g], partition[g])
        if self.evaluator.group_bound_s(times) > base.cost_s + _TOLERANCE_S:  # this move cannot win
            return None
        links, smooth = base.links_s.copy(), base.smooth_s.copy()
        self._bounded_links(partition, links, (a, b))
        if self.evaluator.lower_bound_s(times, links) > base.cost_s + _TOLERANCE_S:
            return None
        self._filled_links(partition, keys, links, smooth, (a, b))
        if self.evaluator.lower_bound_s(times, links) > base.cost_s + _TOLERANCE_S:
            return None
        breakdown, order = self.combine(times, links)
        return Candidate(partition=partition, keys=keys, group_times_s=times, links_s=links, smooth_s=smooth,
                         breakdown=breakdown, order=order)


def improve_by_swaps(
    cached: CachedEvaluator,
    start: Candidate,
    classes: np.ndarray,
    rng: np.random.Generator,
    *,
    deadline: float,
    max_moves_per_pair: int | None = None,
) -> Candidate:
    """First-improvement local search over swaps between groups, until no swap improves the score.

    Args:
        classes: (N,) twin class of each device; a swap of two twins changes nothing and is skipped.
        max_moves_per_pair: on large swarms, try at most this many (random) swaps per pair of groups per pass.
    """
    current = start
    d_pp, d_dp = current.partition.shape
    improved = True
    while improved and time.perf_counter() < deadline:
        improved = False
        for a, b in rng.permutation([(a, b) for a in range(d_pp) for b in range(a + 1, d_pp)]):
            tried: set[tuple[int, int]] = set()
            moves = [(i, j) for i in range(d_dp) for j in range(d_dp)]
            order = rng.permutation(len(moves))[:max_moves_per_pair]
            for index in order:
                if time.perf_counter() >= deadline:
                    break
                i, j = moves[index]
                pair = (classes[current.partition[a, i]], classes[current.partition[b, j]])
                if pair[0] == pair[1] or pair in tried:
                    continue
                tried.add(pair)
                candidate = cached.swapped(current, int(a), i, int(b), j)
                if candidate is not None and candidate.score < current.score:
                    current, improved = candidate, True
                    tried.clear()
            if time.perf_counter() >= deadline:
                break
    return current
