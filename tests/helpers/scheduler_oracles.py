"""Brute-force oracles and small random networks for the scheduler tests (pure Python, tiny instances only)."""
from __future__ import annotations

import itertools

import numpy as np

from hetswarm.protocol.network import Network


def random_network(n: int, seed: int, *, sites: int = 0) -> Network:
    """Symmetric random links; with `sites`, devices of one site share fast links (a geo-distributed toy)."""
    rng = np.random.default_rng(seed)
    latency = rng.uniform(1, 100, (n, n))
    bandwidth = rng.uniform(0.2, 2.0, (n, n))
    labels = [f"s{d % sites}" if sites else f"d{d}" for d in range(n)]
    if sites:
        same = np.array([[a == b for b in labels] for a in labels])
        latency[same], bandwidth[same] = latency[same] / 20, bandwidth[same] * 10
    return Network.from_matrices(np.triu(latency, 1) + np.triu(latency, 1).T,
                                 np.triu(bandwidth, 1) + np.triu(bandwidth, 1).T + np.eye(n), sites=labels)


def brute_bottleneck(weights: np.ndarray) -> float:
    k = len(weights)
    return min(max(weights[i, p[i]] for i in range(k)) for p in itertools.permutations(range(k)))


def brute_path(weights: np.ndarray) -> float:
    n = len(weights)
    return min(sum(weights[p[s], p[s + 1]] for s in range(n - 1)) for p in itertools.permutations(range(n)))


def balanced_partitions(devices: tuple[int, ...], size: int):
    """Every partition of `devices` into groups of `size` (unordered groups)."""
    if not devices:
        yield []
        return
    first, rest = devices[0], devices[1:]
    for others in itertools.combinations(rest, size - 1):
        remaining = tuple(d for d in rest if d not in others)
        for tail in balanced_partitions(remaining, size):
            yield [(first, *others)] + tail


def brute_cost(network: Network, dp_edge_s: np.ndarray, pp_edge_s: np.ndarray, partition) -> float:
    """The cost of docs/dtfm.md written out literally: DataP + 2 · min over stage orders of the bottleneck path."""
    data_p = max(max(sum(dp_edge_s[d, e] for e in group if e != d) for d in group) for group in partition)
    k = len(partition)
    links = np.zeros((k, k))
    for j, k_ in itertools.combinations(range(k), 2):
        links[j, k_] = links[k_, j] = brute_bottleneck(pp_edge_s[np.ix_(partition[j], partition[k_])])
    return data_p + 2 * (brute_path(links) if k > 1 else 0.0)
