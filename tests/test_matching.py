"""Bottleneck perfect matching against brute force, and the assignment it returns really achieves the value."""
from __future__ import annotations

import numpy as np
import pytest
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import maximum_bipartite_matching

from hetswarm.coordinator.scheduling.matching import bottleneck_matching
from tests.helpers.scheduler_oracles import brute_bottleneck


@pytest.mark.parametrize("k", range(1, 7))
def test_matches_brute_force_on_random_small_instances(k):
    rng = np.random.default_rng(k)
    for _ in range(60):
        weights = rng.integers(0, 6, (k, k)).astype(float)  # many ties, as real site-structured networks have
        value, assignment = bottleneck_matching(weights)
        assert value == brute_bottleneck(weights)
        assert sorted(assignment.tolist()) == list(range(k))
        assert weights[np.arange(k), assignment].max() == value


@pytest.mark.parametrize("k", [12, 20, 40])
def test_large_groups_are_optimal_and_achieved(k):
    """No brute force here: the value is achieved, and one step below it no perfect matching exists."""
    weights = np.random.default_rng(k).random((k, k))
    value, assignment = bottleneck_matching(weights)
    assert sorted(assignment.tolist()) == list(range(k))
    assert weights[np.arange(k), assignment].max() == value
    below = weights < value
    assert (maximum_bipartite_matching(csr_matrix(below), perm_type="column") < 0).any()


def test_rejects_non_square():
    with pytest.raises(ValueError, match="square"):
        bottleneck_matching(np.ones((2, 3)))
