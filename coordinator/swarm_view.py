"""The coordinator's view of the swarm: the peers that can train, and their measured network as matrices.

Each pair of volunteers is measured by one of the two (client/peer/link_prober.py), so the latency and bandwidth
matrices are symmetric by construction; when both sides measured, the two figures are averaged. A pair nobody
measured yet is estimated, never left at zero or infinity, and flagged with how it was estimated, in this order:

 * `model`:   both peers measured some link: the models of coordinator/link_estimate.py (network coordinates for
              latency, access and site capacities for bandwidth), priced worse by their error on held-out links;
 * `peers`:   one of the two measured some link: its medians (the larger latency, the smaller bandwidth);
 * `swarm`:   the median of every measured link;
 * `default`: nothing measured at all (DEFAULT_LATENCY_MS, DEFAULT_BANDWIDTH_MBPS).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np

from hetswarm.coordinator.link_estimate import (
    EstimateError,
    conservative,
    describe_error,
    fit_links,
    held_out_error,
)
from hetswarm.protocol.network import Network
from hetswarm.protocol.records import PeerRecord
from hetswarm.protocol.units import MBPS_PER_GBPS

__all__ = ["SwarmView", "build_view", "trainable_peers"]

logger = logging.getLogger(__name__)

TRAINABLE_STATES = ("ready", "training")
DEFAULT_LATENCY_MS = 100.0
DEFAULT_BANDWIDTH_MBPS = 100.0


@dataclass(frozen=True, kw_only=True, slots=True)
class SwarmView:
    """Peers in a fixed order (device index = position), their hardware, and the network between them."""

    peer_ids: tuple[str, ...]
    names: tuple[str | None, ...]
    network: Network
    tflops: np.ndarray
    """(N,) measured TFLOPS."""
    memory_gib: np.ndarray
    """(N,) device memory."""
    estimated: dict[tuple[int, int], str]
    """(i, j) with i < j → how that unmeasured link was estimated (module docstring)."""
    estimate_error: EstimateError | None = None
    """The `model` estimates' error on measured links held out of the fit; None when it could not be judged."""

    @property
    def n_peers(self) -> int:
        return len(self.peer_ids)

    def subset(self, peer_ids: list[str]) -> SwarmView:
        """The view of some of the peers, in the order given."""
        index = [self.peer_ids.index(p) for p in peer_ids]
        position = {old: new for new, old in enumerate(index)}
        network = Network(latency_ms=self.network.latency_ms[np.ix_(index, index)],
                          bandwidth_gbps=self.network.bandwidth_gbps[np.ix_(index, index)],
                          sites=tuple(self.network.sites[i] for i in index), name=self.network.name)
        estimated = {tuple(sorted((position[i], position[j]))): how
                     for (i, j), how in self.estimated.items() if i in position and j in position}
        return SwarmView(peer_ids=tuple(peer_ids), names=tuple(self.names[i] for i in index), network=network,
                         tflops=self.tflops[index], memory_gib=self.memory_gib[index], estimated=estimated,
                         estimate_error=self.estimate_error)

    def estimated_among(self, pipelines: list[list[int]]) -> list[tuple[str, str]]:
        """The estimated links a plan of these pipelines (device indices, in stage order) sends over: each
        pipeline's hops, then each stage group's pairs, as (smaller id, larger id)."""
        hops = [(a, b) for chain in pipelines for a, b in zip(chain, chain[1:])]
        groups = [(chain[s], other[s]) for i, chain in enumerate(pipelines) for other in pipelines[i + 1:]
                  for s in range(len(chain))]
        return list(dict.fromkeys(tuple(sorted((self.peer_ids[a], self.peer_ids[b]))) for a, b in hops + groups
                                  if (min(a, b), max(a, b)) in self.estimated))

    def estimate_note(self) -> str:
        """For logs: nothing when every link was measured, else how many were estimated and with what error."""
        if not self.estimated:
            return ""
        return f"; priced on {len(self.estimated)} estimated links, {describe_error(self.estimate_error)}"

    def to_dict(self) -> dict[str, Any]:
        """JSON in the scenario format, so `hetswarm schedule --scenario FILE` plans the same matrices."""
        latency = self.network.latency_ms.copy()
        bandwidth = self.network.bandwidth_gbps.copy()
        np.fill_diagonal(bandwidth, 0.0)  # unused; JSON has no infinity
        return {
            "latency_ms_matrix": latency.tolist(),
            "bandwidth_gbps_matrix": bandwidth.tolist(),
            "devices": [{"id": i, "group": site, "peer_id": peer, "name": name, "tflops": float(tflops),
                         "memory_gib": float(memory)}
                        for i, (site, peer, name, tflops, memory) in enumerate(zip(
                            self.network.sites, self.peer_ids, self.names, self.tflops, self.memory_gib))],
            "estimated_links": [{"a": i, "b": j, "method": how} for (i, j), how in sorted(self.estimated.items())],
        }


def build_view(records: dict[str, PeerRecord], *, name: str = "swarm") -> SwarmView:
    """The view of the peers whose record says they can train (ready or training, with a measured GPU).

    Raises:
        InvalidNetwork: no such peer (a network has at least one device).
    """
    peers = trainable_peers(records)
    n = len(peers)
    sites = [records[p].site or p for p in peers]
    latency, bandwidth = np.zeros((n, n)), np.zeros((n, n))  # bandwidth in Mbit/s until the end
    measured = np.zeros((n, n), dtype=bool)
    for i, a in enumerate(peers):
        for j, b in enumerate(peers[i + 1:], start=i + 1):
            links = [m for m in (records[a].links.get(b), records[b].links.get(a)) if m is not None]
            if links:
                latency[i, j] = latency[j, i] = float(np.mean([m.latency_ms for m in links]))
                bandwidth[i, j] = bandwidth[j, i] = float(np.mean([m.bandwidth_mbps for m in links]))
                measured[i, j] = measured[j, i] = True
    estimated, error = _estimate_missing(latency, bandwidth, measured, tuple(sites), tuple(peers))
    network = Network(latency_ms=latency, bandwidth_gbps=bandwidth / MBPS_PER_GBPS, sites=tuple(sites),
                      name=name)
    return SwarmView(
        peer_ids=tuple(peers), names=tuple(records[p].public_name for p in peers), network=network,
        tflops=np.array([records[p].hardware.tflops for p in peers]),
        memory_gib=np.array([records[p].hardware.memory_gib for p in peers]), estimated=estimated,
        estimate_error=error,
    )


def trainable_peers(records: dict[str, PeerRecord]) -> list[str]:
    """Peer ids, sorted, of the records that say their peer can train now."""
    return sorted(p for p, r in records.items() if r.state in TRAINABLE_STATES and r.hardware.tflops > 0)


def _estimate_missing(latency: np.ndarray, bandwidth: np.ndarray, measured: np.ndarray, sites: tuple[str, ...],
                      peers: tuple[str, ...]) -> tuple[dict[tuple[int, int], str], EstimateError | None]:
    """Fills the unmeasured pairs in place from measured ones only; says how each was filled, and the error of the
    `model` estimates."""
    upper = np.triu(measured, 1)
    unmeasured = np.triu(~measured, 1)
    if not unmeasured.any():
        return {}, None
    has_links = measured.any(axis=1)
    modelled = unmeasured & has_links[:, None] & has_links[None, :]
    estimated, error = {}, None
    if modelled.any():
        error = held_out_error(latency, bandwidth, measured, sites, peers)
        model = fit_links(latency, bandwidth, measured, sites)
        rows, cols = np.nonzero(modelled)
        lat, bw = conservative(model.latency_ms(rows, cols), model.bandwidth_mbps(rows, cols), error)
        latency[rows, cols] = latency[cols, rows] = lat
        bandwidth[rows, cols] = bandwidth[cols, rows] = bw
        estimated = {(int(i), int(j)): "model" for i, j in zip(rows, cols)}
    for i, j in zip(*np.nonzero(unmeasured & ~modelled)):
        if has_links[i] or has_links[j]:
            lat = max(np.median(latency[k, measured[k]]) for k in (i, j) if has_links[k])
            bw = min(np.median(bandwidth[k, measured[k]]) for k in (i, j) if has_links[k])
            how = "peers"
        elif upper.any():
            lat, bw, how = np.median(latency[upper]), np.median(bandwidth[upper]), "swarm"
        else:
            lat, bw, how = DEFAULT_LATENCY_MS, DEFAULT_BANDWIDTH_MBPS, "default"
        latency[i, j] = latency[j, i] = lat
        bandwidth[i, j] = bandwidth[j, i] = bw
        estimated[int(i), int(j)] = how
    return dict(sorted(estimated.items())), error
