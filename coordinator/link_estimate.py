"""Estimates of the links nobody measured, from those measured, with an error figure validated on held-out pairs.

Past the measurement budget (protocol/measurement_policy.py) most pairs of a large swarm are never measured, so
the scheduler plans over estimates. Two models, each with few parameters per peer, so that ~k measurements per peer
determine them:

* **Latency: network coordinates with height**, the model of Vivaldi (Dabek et al., "Vivaldi: a decentralized
  network coordinate system", SIGCOMM 2004, §5.3) as Serf and Consul use it: each peer is a point in a small
  Euclidean space plus a height (its access link's delay), and a pair's latency is the distance between the points
  plus both heights. Vivaldi relaxes springs peer by peer because no node holds every measurement; the coordinator
  holds them all, so it fits the same model by least squares on the relative error (L-BFGS-B, scipy).
* **Bandwidth: the narrowest of three pipes.** A transfer is held to the sender's and the receiver's access capacity
  and to what the path between their two sites carries: `min(c_i, c_j, s(site_i, site_j))`. Each peer's capacity is
  the most it achieved on any measured link, each site pair's the most any of its measured links achieved: lower
  bounds, so the estimate errs low, the safe side for a plan. A pair of sites nobody measured is bounded by the
  narrowest measured path out of either site (a path is not assumed wide because nobody looked: the search would
  seek out exactly such links, as it did in benchmarks/scale_sim.py before this bound); within a site nobody
  measured, only the access links bound it. A peer that declares no site is a site of its own
  (coordinator/swarm_view.py), so its narrowest measured link bounds its unmeasured ones.

The error figure is judged on data the fit did not see: every fifth measured pair (by a hash of the pair, so the
same pairs every time) is held out, the models are fitted on the rest and judged on the held-out pairs (median
relative error), and then fitted again on everything. The scheduler prices estimated links by that error,
pessimistically (`conservative`): latency up, bandwidth down.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import scipy.optimize

__all__ = ["EstimateError", "LinkModel", "UNVALIDATED_ERROR", "conservative", "describe_error", "fit_links",
           "held_out_error"]

DIMENSIONS = 4
"""Of the coordinate space; with the height, five numbers per peer (Serf uses 8 dimensions for a whole planet's
nodes; a fit on ~k links per peer needs fewer)."""
HOLD_OUT_EVERY = 5
MIN_HELD_OUT = 4
"""Fewer held-out pairs than this say nothing of the error: the error is then unknown."""
UNVALIDATED_ERROR = 0.5
"""The error assumed when it could not be validated (too few measured pairs to hold some out)."""
MAX_ITERATIONS = 500
"""Of the coordinate fit: at 1,000 peers the error on unmeasured pairs is the same at 250, 500 and 2,000
(benchmarks/scale_sim.py), while 2,000 took 4 s."""
MIN_LATENCY_MS = 1.0
"""A floor under measured latencies in the relative error, so loopback's 0.1 ms does not outweigh everything."""


@dataclass(frozen=True, kw_only=True, slots=True)
class EstimateError:
    """Median relative error of the estimates on measured pairs held out of the fit."""

    latency: float
    bandwidth: float
    held_out: int
    """How many measured pairs were held out to judge the estimates."""


def describe_error(error: EstimateError | None) -> str:
    """The error as logs and the monitor state it."""
    if error is None:
        return f"error unknown (too few measured links to hold some out), priced as ±{UNVALIDATED_ERROR:.0%}"
    return (f"latency ±{error.latency:.0%}, bandwidth ±{error.bandwidth:.0%} "
            f"(median error on {error.held_out} measured links held out of the fit)")


@dataclass(frozen=True, kw_only=True, slots=True)
class LinkModel:
    """The fitted models of one swarm's links (module docstring)."""

    coordinates: np.ndarray
    """(N, DIMENSIONS) network coordinates, in ms."""
    heights_ms: np.ndarray
    """(N,) each peer's access delay."""
    capacity_mbps: np.ndarray
    """(N,) the most each peer achieved on a measured link; NaN for a peer without one."""
    site_capacity_mbps: dict[frozenset[str], float]
    """The most any measured link between two sites (or within one) achieved."""
    narrowest_path_mbps: dict[str, float]
    """Per site, the least of its measured paths to other sites: the bound of a path out of it nobody measured."""
    sites: tuple[str, ...]

    def latency_ms(self, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
        distance = np.linalg.norm(self.coordinates[rows] - self.coordinates[cols], axis=-1)
        return distance + self.heights_ms[rows] + self.heights_ms[cols]

    def bandwidth_mbps(self, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
        paths = np.array([self._path_mbps(self.sites[i], self.sites[j]) for i, j in zip(rows, cols)])
        return np.fmin(np.fmin(self.capacity_mbps[rows], self.capacity_mbps[cols]), paths)

    def _path_mbps(self, a: str, b: str) -> float:
        measured = self.site_capacity_mbps.get(frozenset((a, b)))
        if measured is not None:
            return measured
        if a == b:
            return np.inf
        return min(self.narrowest_path_mbps.get(a, np.inf), self.narrowest_path_mbps.get(b, np.inf))


def fit_links(latency_ms: np.ndarray, bandwidth_mbps: np.ndarray, measured: np.ndarray, sites: tuple[str, ...],
              *, seed: int = 0) -> LinkModel:
    """The models fitted to the `measured` pairs of the (N, N) symmetric matrices."""
    rows, cols = np.nonzero(np.triu(measured, 1))
    n = len(sites)
    coordinates, heights = _fit_coordinates(n, rows, cols, latency_ms[rows, cols], seed=seed)
    capacity = np.full(n, np.nan)
    site_capacity: dict[frozenset[str], float] = {}
    for i, j, bandwidth in zip(rows, cols, bandwidth_mbps[rows, cols]):
        capacity[i], capacity[j] = np.fmax(capacity[i], bandwidth), np.fmax(capacity[j], bandwidth)
        pair = frozenset((sites[i], sites[j]))
        site_capacity[pair] = max(site_capacity.get(pair, 0.0), float(bandwidth))
    narrowest: dict[str, float] = {}
    for pair, bandwidth in site_capacity.items():
        for site in pair if len(pair) == 2 else ():
            narrowest[site] = min(narrowest.get(site, np.inf), bandwidth)
    return LinkModel(coordinates=coordinates, heights_ms=heights, capacity_mbps=capacity,
                     site_capacity_mbps=site_capacity, narrowest_path_mbps=narrowest, sites=sites)


def held_out_error(latency_ms: np.ndarray, bandwidth_mbps: np.ndarray, measured: np.ndarray,
                   sites: tuple[str, ...], peer_ids: tuple[str, ...]) -> EstimateError | None:
    """The models' error on the measured pairs held out of a fit on the others; None when too few pairs were
    measured to hold any out (then UNVALIDATED_ERROR stands in)."""
    rows, cols = np.nonzero(np.triu(measured, 1))
    held = np.array([_hold_out(peer_ids[i], peer_ids[j]) for i, j in zip(rows, cols)], dtype=bool)
    kept = measured.copy()
    kept[rows[held], cols[held]] = kept[cols[held], rows[held]] = False
    if (held & kept.any(axis=1)[rows] & kept.any(axis=1)[cols]).sum() < MIN_HELD_OUT:
        return None
    model = fit_links(latency_ms, bandwidth_mbps, kept, sites)
    judged = held & kept.any(axis=1)[rows] & kept.any(axis=1)[cols]  # as estimates are made: both peers measured
    rows, cols = rows[judged], cols[judged]
    return EstimateError(
        latency=_median_relative_error(model.latency_ms(rows, cols), latency_ms[rows, cols]),
        bandwidth=_median_relative_error(model.bandwidth_mbps(rows, cols), bandwidth_mbps[rows, cols]),
        held_out=len(rows))


def conservative(latency_ms: np.ndarray, bandwidth_mbps: np.ndarray, error: EstimateError | None
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Estimates as the scheduler prices them: worse by the validated error (UNVALIDATED_ERROR when unknown)."""
    latency_error = UNVALIDATED_ERROR if error is None else error.latency
    bandwidth_error = UNVALIDATED_ERROR if error is None else error.bandwidth
    return latency_ms * (1 + latency_error), bandwidth_mbps / (1 + bandwidth_error)


def _fit_coordinates(n: int, rows: np.ndarray, cols: np.ndarray, latency_ms: np.ndarray, *, seed: int
                     ) -> tuple[np.ndarray, np.ndarray]:
    """Coordinates and heights minimising the squared relative error of the modelled latencies."""
    if len(rows) == 0:
        return np.zeros((n, DIMENSIONS)), np.zeros(n)
    target = np.maximum(latency_ms, MIN_LATENCY_MS)
    scale = float(np.median(target))
    start = np.concatenate([np.random.default_rng(seed).normal(0.0, scale / 2, n * DIMENSIONS),
                            np.full(n, scale / 10)])

    def loss(params: np.ndarray) -> tuple[float, np.ndarray]:
        points, heights = params[:n * DIMENSIONS].reshape(n, DIMENSIONS), params[n * DIMENSIONS:]
        apart = points[rows] - points[cols]
        distance = np.sqrt((apart ** 2).sum(axis=1) + 1e-9)
        residual = (distance + heights[rows] + heights[cols] - target) / target
        weight = 2 * residual / target
        toward = apart * (weight / distance)[:, None]
        grad_points = np.stack([np.bincount(rows, toward[:, d], n) - np.bincount(cols, toward[:, d], n)
                                for d in range(DIMENSIONS)], axis=1)
        grad_heights = np.bincount(rows, weight, n) + np.bincount(cols, weight, n)
        return float((residual ** 2).sum()), np.concatenate([grad_points.ravel(), grad_heights])

    bounds = [(None, None)] * (n * DIMENSIONS) + [(0.0, None)] * n
    result = scipy.optimize.minimize(loss, start, jac=True, method="L-BFGS-B", bounds=bounds,
                                     options={"maxiter": MAX_ITERATIONS})
    return result.x[:n * DIMENSIONS].reshape(n, DIMENSIONS), result.x[n * DIMENSIONS:]


def _hold_out(a: str, b: str) -> bool:
    """Whether the pair is held out of the validating fit: the same pairs every time, about one in HOLD_OUT_EVERY."""
    low, high = sorted((a, b))
    return hashlib.sha256(f"{low}|{high}".encode()).digest()[0] % HOLD_OUT_EVERY == 0


def _median_relative_error(estimate: np.ndarray, truth: np.ndarray) -> float:
    return float(np.median(np.abs(estimate - truth) / np.maximum(truth, 1e-9)))
