"""Open-path TSP over stage groups: the order of stages along every pipeline (DT-FM's PipeP, docs/dtfm.md).

Exact Held–Karp up to `EXACT_MAX_NODES` groups (n^2·2^n steps, vectorised one subset size at a time; the reference
runs it once per start node in Python), a nearest-neighbour + 2-opt + Or-opt heuristic beyond, where the exact
table would not fit in time or memory.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

__all__ = ["EXACT_MAX_NODES", "held_karp_path", "heuristic_path", "shortest_path"]

EXACT_MAX_NODES = 12
"""Above this many groups the heuristic is used: 12^2·2^12 ≈ 0.6M steps, while 16 groups would be 17M per call."""


def shortest_path(weights: np.ndarray) -> tuple[float, list[int]]:
    """The cheapest Hamiltonian path through all nodes (any start, any end): exact when small, else heuristic."""
    weights = np.asarray(weights, dtype=float)
    if len(weights) <= EXACT_MAX_NODES:
        return held_karp_path(weights)
    return heuristic_path(weights)


def held_karp_path(weights: np.ndarray) -> tuple[float, list[int]]:
    """Exact open-path TSP by dynamic programming over subsets (Held & Karp 1962), for symmetric or not weights.

    best[S, j] is the cheapest path that visits exactly the set S and ends at j; a path may start anywhere.
    """
    n = len(weights)
    if n == 1:
        return 0.0, [0]
    best = np.full((1 << n, n), np.inf)  # (2^n, n)
    parent = np.full((1 << n, n), -1, dtype=np.int64)
    best[1 << np.arange(n), np.arange(n)] = 0.0
    for masks, previous, has_end in _subset_layers(n)[1:]:
        # candidate[m, j, i] = best[m without j, i] + w[i, j], only where j is in the subset m
        candidate = best[previous] + weights.T[None, :, :]  # (C, n, n)
        candidate[~has_end] = np.inf
        parent[masks] = np.argmin(candidate, axis=2)
        best[masks] = np.take_along_axis(candidate, parent[masks][:, :, None], axis=2)[:, :, 0]
    full = (1 << n) - 1
    end = int(np.argmin(best[full]))
    cost, order, mask = float(best[full, end]), [end], full
    while len(order) < n:
        previous_node = int(parent[mask, order[-1]])
        mask ^= 1 << order[-1]
        order.append(previous_node)
    return cost, order[::-1]


@lru_cache(maxsize=None)
def _subset_layers(n: int) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """For each subset size p: the subsets (C,), each with node j removed (C, n), and whether j was in it (C, n)."""
    all_masks = np.arange(1 << n)
    sizes = np.array([bin(m).count("1") for m in all_masks])
    bits = 1 << np.arange(n)
    layers = []
    for size in range(1, n + 1):
        masks = all_masks[sizes == size]
        has_end = (masks[:, None] & bits[None, :]) != 0  # (C, n)
        previous = np.where(has_end, masks[:, None] ^ bits[None, :], 0)  # (C, n)
        layers.append((masks, previous, has_end))
    return layers


def heuristic_path(weights: np.ndarray, *, starts: int = 8) -> tuple[float, list[int]]:
    """A good open path for many nodes: nearest neighbour from a few starts, each improved by 2-opt and Or-opt.

    The open path is handled as a closed tour through one extra node that costs nothing to reach, so that the
    path's ends need no special case. Assumes symmetric weights (2-opt reverses segments), as the bottleneck
    weights of a symmetric network are.
    """
    n = len(weights)
    if n <= 2:
        return held_karp_path(weights)
    tour_weights = np.zeros((n + 1, n + 1))  # node n is the free extra node
    tour_weights[:n, :n] = weights
    best_cost, best_order = np.inf, list(range(n))
    for start in np.linspace(0, n - 1, min(starts, n)).astype(int):
        tour = _two_opt_or_opt(tour_weights, np.array([n] + _nearest_neighbour(weights, int(start))))
        order = [int(node) for node in tour[1:]]
        cost = path_cost(weights, order)
        if cost < best_cost - 1e-12:
            best_cost, best_order = cost, order
    return float(best_cost), best_order


def path_cost(weights: np.ndarray, order: list[int]) -> float:
    """Sum of the weights along consecutive nodes of a path."""
    return float(weights[order[:-1], order[1:]].sum())


def _nearest_neighbour(weights: np.ndarray, start: int) -> list[int]:
    order, unvisited = [start], np.ones(len(weights), dtype=bool)
    unvisited[start] = False
    while unvisited.any():
        candidates = np.where(unvisited, weights[order[-1]], np.inf)
        order.append(int(np.argmin(candidates)))
        unvisited[order[-1]] = False
    return order


def _two_opt_or_opt(weights: np.ndarray, tour: np.ndarray) -> np.ndarray:
    """Best-improvement 2-opt, then Or-opt (move a run of 1–3 nodes, either way round), until neither helps."""
    m = len(tour)
    while True:
        nxt = np.roll(tour, -1)  # (m,) successor of each tour position
        # 2-opt: reverse tour[i..j] for 1 <= i < j <= m-1; edges (i-1, i), (j, j+1) become (i-1, j), (i, j+1).
        prv = np.roll(tour, 1)
        delta = (weights[prv[:, None], tour[None, :]] + weights[tour[:, None], nxt[None, :]]
                 - weights[prv, tour][:, None] - weights[tour, nxt][None, :])  # (m, m) for (i, j)
        delta[np.tril_indices(m)] = np.inf
        delta[0, :] = np.inf  # position 0 holds the extra node and stays put
        i, j = np.unravel_index(np.argmin(delta), delta.shape)
        if delta[i, j] < -1e-12:
            tour = np.concatenate([tour[:i], tour[i : j + 1][::-1], tour[j + 1 :]])
            continue
        moved = _or_opt_move(weights, tour)
        if moved is None:
            return tour
        tour = moved


def _or_opt_move(weights: np.ndarray, tour: np.ndarray) -> np.ndarray | None:
    """The first improving move of a run of 1–3 consecutive nodes to another edge of the tour, or None."""
    m = len(tour)
    for length in (1, 2, 3):
        for i in range(1, m - length + 1):
            run = tour[i : i + length]
            before, after = tour[i - 1], tour[(i + length) % m]
            removal_gain = weights[before, run[0]] + weights[run[-1], after] - weights[before, after]
            rest = np.concatenate([tour[:i], tour[i + length :]])
            a, b = rest, np.roll(rest, -1)  # insert between a[q] and b[q]
            forward = weights[a, run[0]] + weights[run[-1], b] - weights[a, b]
            backward = weights[a, run[-1]] + weights[run[0], b] - weights[a, b]
            q_forward, q_backward = int(np.argmin(forward)), int(np.argmin(backward))
            if min(forward[q_forward], backward[q_backward]) < removal_gain - 1e-12:
                q, piece = (q_forward, run) if forward[q_forward] <= backward[q_backward] else (q_backward, run[::-1])
                return np.concatenate([rest[: q + 1], piece, rest[q + 1 :]])
    return None
