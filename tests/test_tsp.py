"""Open-path TSP: Held–Karp against brute force, the heuristic against Held–Karp."""
from __future__ import annotations

import numpy as np
import pytest

from hetswarm.coordinator.scheduling.tsp import (
    EXACT_MAX_NODES,
    held_karp_path,
    heuristic_path,
    path_cost,
    shortest_path,
)
from tests.helpers.scheduler_oracles import brute_path


def _symmetric(n: int, rng: np.random.Generator) -> np.ndarray:
    weights = rng.random((n, n))
    weights = weights + weights.T
    np.fill_diagonal(weights, 0)
    return weights


@pytest.mark.parametrize("n", range(1, 8))
def test_held_karp_matches_brute_force(n):
    rng = np.random.default_rng(n)
    for _ in range(20):
        weights = rng.random((n, n))  # asymmetric too: Held–Karp does not assume symmetry
        cost, order = held_karp_path(weights)
        assert sorted(order) == list(range(n))
        assert cost == pytest.approx(brute_path(weights) if n > 1 else 0.0)
        assert path_cost(weights, order) == pytest.approx(cost)


@pytest.mark.parametrize("n", [5, 9, 12])
def test_heuristic_is_valid_and_close_to_exact(n):
    rng = np.random.default_rng(100 + n)
    for _ in range(10):
        weights = _symmetric(n, rng)
        exact, _ = held_karp_path(weights)
        cost, order = heuristic_path(weights)
        assert sorted(order) == list(range(n))
        assert path_cost(weights, order) == pytest.approx(cost)
        assert exact - 1e-9 <= cost <= 1.05 * exact


def test_shortest_path_switches_to_the_heuristic_beyond_the_exact_limit():
    weights = _symmetric(EXACT_MAX_NODES + 8, np.random.default_rng(0))
    cost, order = shortest_path(weights)
    assert sorted(order) == list(range(len(weights))) and path_cost(weights, order) == pytest.approx(cost)
