"""The link estimator against a synthetic network whose coordinates, heights and capacities are known."""
from __future__ import annotations

import numpy as np
import pytest

from hetswarm.coordinator.link_estimate import (
    UNVALIDATED_ERROR,
    EstimateError,
    conservative,
    describe_error,
    fit_links,
    held_out_error,
)

N_PEERS, N_SITES, LINKS_PER_PEER = 48, 4, 8


NOISE = 0.05
"""Each measurement is off the truth by up to this fraction, either way."""


def symmetric(matrix: np.ndarray) -> np.ndarray:
    return np.triu(matrix, 1) + np.triu(matrix, 1).T


def synthetic(seed: int) -> tuple[np.ndarray, np.ndarray, tuple[str, ...]]:
    """The true links: latency = distance on a plane, lengthened by a detour of up to 20 % per pair of sites (routes
    are not straight lines), + both peers' access delay; bandwidth = the narrowest of both access links and the two
    sites' path."""
    rng = np.random.default_rng(seed)
    site = rng.integers(0, N_SITES, N_PEERS)
    centres = rng.uniform(0, 150, (N_SITES, 2))
    points = centres[site] + rng.normal(0, 3, (N_PEERS, 2))
    heights = rng.uniform(1, 10, N_PEERS)
    detour = rng.uniform(1.0, 1.2, (N_SITES, N_SITES))
    detour = np.maximum(detour, detour.T)
    distance = np.linalg.norm(points[:, None] - points[None, :], axis=-1) * detour[site][:, site]
    latency = distance + heights[:, None] + heights[None, :]
    access = rng.uniform(100, 1000, N_PEERS)
    paths = rng.uniform(50, 2000, (N_SITES, N_SITES))
    paths = np.minimum(paths, paths.T)
    bandwidth = np.minimum(np.minimum(access[:, None], access[None, :]), paths[site][:, site])
    return symmetric(latency), symmetric(bandwidth), tuple(f"site{s}" for s in site)


def measured_figures(latency: np.ndarray, bandwidth: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """What probes would report: each pair's figures off by up to NOISE."""
    noise = symmetric(np.random.default_rng(seed + 100).uniform(1 - NOISE, 1 + NOISE, latency.shape))
    return latency * noise, bandwidth * noise


def sparse_sample(seed: int) -> np.ndarray:
    """Each peer measures LINKS_PER_PEER random others (a pair measured by either end is known to both)."""
    rng = np.random.default_rng(seed)
    measured = np.zeros((N_PEERS, N_PEERS), dtype=bool)
    for i in range(N_PEERS):
        others = rng.choice(np.delete(np.arange(N_PEERS), i), LINKS_PER_PEER, replace=False)
        measured[i, others] = measured[others, i] = True
    return measured


PEER_IDS = tuple(f"peer{i:02d}" for i in range(N_PEERS))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_unmeasured_links_are_estimated_within_the_issue_s_bounds_and_the_bandwidth_errs_low(seed):
    latency, bandwidth, sites = synthetic(seed)
    measured = sparse_sample(seed)
    assert measured.sum() / (N_PEERS * (N_PEERS - 1)) < 0.4  # most pairs unmeasured
    model = fit_links(*measured_figures(latency, bandwidth, seed), measured, sites, seed=seed)
    rows, cols = np.nonzero(np.triu(~measured, 1))
    latency_error = np.abs(model.latency_ms(rows, cols) - latency[rows, cols]) / latency[rows, cols]
    estimated_bandwidth = model.bandwidth_mbps(rows, cols)
    bandwidth_error = np.abs(estimated_bandwidth - bandwidth[rows, cols]) / bandwidth[rows, cols]
    assert np.median(latency_error) <= 0.10
    assert np.median(bandwidth_error) <= 0.25
    known_paths = np.array([frozenset((sites[i], sites[j])) in model.site_capacity_mbps for i, j in zip(rows, cols)])
    assert (estimated_bandwidth[known_paths] <= (1 + NOISE) * bandwidth[rows, cols][known_paths]).all()  # errs low


def test_the_held_out_error_tells_a_good_fit_from_a_bad_one():
    latency, bandwidth, sites = synthetic(0)
    measured = sparse_sample(0)
    latency, bandwidth = measured_figures(latency, bandwidth, 0)
    error = held_out_error(latency, bandwidth, measured, sites, PEER_IDS)
    assert error is not None and error.held_out >= 20
    assert error.latency <= 0.10 and error.bandwidth <= 0.25
    # Latencies with no geometry at all (each pair its own random figure) fit badly, and the figure says so.
    scrambled = symmetric(np.random.default_rng(5).uniform(1, 300, latency.shape))
    worse = held_out_error(scrambled, bandwidth, measured, sites, PEER_IDS)
    assert worse is not None and worse.latency > 2 * error.latency


def test_too_few_measurements_leave_the_error_unknown_and_pricing_assumes_the_default():
    latency, bandwidth, sites = synthetic(0)
    measured = np.zeros_like(latency, dtype=bool)
    measured[0, 1] = measured[1, 0] = measured[1, 2] = measured[2, 1] = True
    assert held_out_error(latency, bandwidth, measured, sites, PEER_IDS) is None
    lat, bw = conservative(np.array([10.0]), np.array([300.0]), None)
    assert lat[0] == pytest.approx(10 * (1 + UNVALIDATED_ERROR)) and bw[0] == pytest.approx(300 / (1 + UNVALIDATED_ERROR))


def test_conservative_pricing_is_worse_by_the_validated_error():
    error = EstimateError(latency=0.1, bandwidth=0.2, held_out=30)
    lat, bw = conservative(np.array([100.0]), np.array([600.0]), error)
    assert lat[0] == pytest.approx(110.0) and bw[0] == pytest.approx(500.0)
    assert "latency ±10%, bandwidth ±20%" in describe_error(error) and "unknown" in describe_error(None)


def test_a_path_nobody_measured_is_bounded_by_the_narrowest_measured_path_of_its_sites():
    """Sites X, Y, Z; X–Y carries 500, X–Z 100; nobody measured Y–Z or inside X. Peers' access links are wide."""
    sites = ("X", "X", "Y", "Z")
    bandwidth = np.zeros((4, 4))
    measured = np.zeros((4, 4), dtype=bool)
    for (i, j), figure in {(0, 2): 500.0, (1, 3): 100.0, (0, 3): 100.0, (1, 2): 500.0}.items():
        bandwidth[i, j] = bandwidth[j, i] = figure
        measured[i, j] = measured[j, i] = True
    model = fit_links(np.where(measured, 20.0, 0.0), bandwidth, measured, sites)
    assert model.bandwidth_mbps(np.array([2]), np.array([3]))[0] == 100.0  # Y–Z: Z's narrowest path
    assert model.bandwidth_mbps(np.array([0]), np.array([1]))[0] == 500.0  # inside X: the access links (500, 500)
