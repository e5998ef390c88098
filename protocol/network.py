"""The network a plan is made for: per-pair latency and bandwidth between devices, and the site of each device.

Scenario files (the DT-FM paper's five networks) ship in the package under `scenarios/`; `load_network` finds
them by a short name (`worldwide`), by `case1`…`case5`, or reads any file of the same shape.

Hardware scenarios (`HARDWARE_SCENARIOS`) put mixed GPUs on one of those networks: their file names a base network
(`"network": "datacenter"`) whose links they borrow device for device, and each device entry carries its `gpu`,
`tflops` and `memory_gib`, with the vendor datasheets cited under `sources`. Without those fields a scenario is
homogeneous, as the paper's are.
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from hetswarm.protocol.errors import RejectedInput

__all__ = ["HARDWARE_SCENARIOS", "InvalidNetwork", "Network", "PAPER_SCENARIOS", "SCENARIOS", "load_hardware",
           "load_network", "load_scenario"]

logger = logging.getLogger(__name__)

PAPER_SCENARIOS: dict[str, str] = {
    "datacenter": "case1_datacenter_on_demand.json",
    "spot": "case2_datacenter_spot.json",
    "multi-datacenter": "case3_multiple_datacenters.json",
    "regional": "case4_regional_geo_distributed.json",
    "worldwide": "case5_worldwide_geo_distributed.json",
}
"""Short name → file of the paper's scenarios (cases 1–5 in docs/dtfm.md, in that order)."""
HARDWARE_SCENARIOS: dict[str, str] = {
    "mixed-datacenter": "hetero_mixed_datacenter.json",
    "mixed-regional": "hetero_mixed_regional.json",
    "volunteer-mix": "hetero_volunteer_mix.json",
    "memory-bound": "hetero_memory_bound.json",
}
"""Short name → file of the scenarios with mixed GPUs (module docstring)."""
SCENARIOS: dict[str, str] = PAPER_SCENARIOS | HARDWARE_SCENARIOS


class InvalidNetwork(RejectedInput):
    """Latency or bandwidth data the cost model cannot price: wrong shape, asymmetric, negative or zero links."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Network:
    """Link matrices between N devices; the diagonal is never used (a device does not send to itself)."""

    latency_ms: np.ndarray
    """(N, N) one-way latency, milliseconds (alpha in the paper)."""
    bandwidth_gbps: np.ndarray
    """(N, N) bandwidth, Gbit/s (beta in the paper)."""
    sites: tuple[str, ...]
    """Site (region, data center, instance) of each device; plans and plots show these names."""
    name: str = "network"
    published_best_cost_s: float | None = None
    """The DT-FM scheduler's best published cost on this network, when it is one of the paper's."""
    twin_classes: np.ndarray = field(init=False)
    """(N,) class id per device; devices of one class are interchangeable (swapping them leaves both matrices
    unchanged), so a group's cost depends only on its multiset of classes. The search caches on that."""

    def __post_init__(self) -> None:
        latency = _checked_matrix("latency_ms", self.latency_ms)
        bandwidth = _checked_matrix("bandwidth_gbps", self.bandwidth_gbps)
        if latency.shape != bandwidth.shape:
            raise InvalidNetwork(
                f"latency_ms is {latency.shape} but bandwidth_gbps is {bandwidth.shape}; both must be (N, N)"
            )
        off_diagonal = ~np.eye(len(latency), dtype=bool)
        if (latency[off_diagonal] < 0).any():
            d, e = np.argwhere((latency < 0) & off_diagonal)[0]
            raise InvalidNetwork(f"latency_ms[{d}, {e}] = {latency[d, e]} is negative; latencies must be >= 0 ms")
        if (bandwidth[off_diagonal] <= 0).any():
            d, e = np.argwhere((bandwidth <= 0) & off_diagonal)[0]
            raise InvalidNetwork(f"bandwidth_gbps[{d}, {e}] = {bandwidth[d, e]} must be positive (Gbit/s)")
        if len(self.sites) != len(latency):
            raise InvalidNetwork(f"{len(self.sites)} site names for {len(latency)} devices; give one per device")
        latency, bandwidth = latency.copy(), bandwidth.copy()
        np.fill_diagonal(latency, 0.0)
        np.fill_diagonal(bandwidth, np.inf)  # unused; inf keeps 8c/beta finite and zero
        latency.flags.writeable = bandwidth.flags.writeable = False
        object.__setattr__(self, "latency_ms", latency)
        object.__setattr__(self, "bandwidth_gbps", bandwidth)
        object.__setattr__(self, "sites", tuple(str(s) for s in self.sites))
        object.__setattr__(self, "twin_classes", _twin_classes(latency, bandwidth, self.sites))

    @property
    def n_devices(self) -> int:
        return len(self.sites)

    def subset(self, devices: list[int]) -> Network:
        """The links among `devices` only, in that order (device i of the result is devices[i])."""
        keep = np.asarray(devices)
        return Network(latency_ms=self.latency_ms[np.ix_(keep, keep)],
                       bandwidth_gbps=self.bandwidth_gbps[np.ix_(keep, keep)],
                       sites=tuple(self.sites[d] for d in devices), name=self.name)

    @classmethod
    def from_matrices(
        cls, latency_ms: Any, bandwidth_gbps: Any, *, sites: list[str] | None = None, name: str = "network"
    ) -> Network:
        """A network from nested lists or arrays; without site names every device is its own site."""
        n = len(latency_ms)
        return cls(
            latency_ms=np.asarray(latency_ms, dtype=float),
            bandwidth_gbps=np.asarray(bandwidth_gbps, dtype=float),
            sites=tuple(sites) if sites is not None else tuple(f"device-{d}" for d in range(n)),
            name=name,
        )

    @classmethod
    def from_scenario(cls, data: dict[str, Any], *, name: str | None = None) -> Network:
        """A network from a scenario dict (keys `latency_ms_matrix`, `bandwidth_gbps_matrix`, `devices`)."""
        try:
            latency, bandwidth = data["latency_ms_matrix"], data["bandwidth_gbps_matrix"]
            devices = data["devices"]
        except (KeyError, TypeError) as e:
            needed = "latency_ms_matrix, bandwidth_gbps_matrix, devices"
            raise InvalidNetwork(f"scenario lacks {e}; it needs {needed}") from None
        sites = [device["group"] if isinstance(device, dict) else str(device) for device in devices]
        published = (data.get("reference_best_cost_seconds_dtfm_cost_model") or {}).get("ours")
        return cls(
            latency_ms=np.asarray(latency, dtype=float),
            bandwidth_gbps=np.asarray(bandwidth, dtype=float),
            sites=tuple(sites),
            name=name or data.get("name", "scenario"),
            published_best_cost_s=min(published) if published else None,
        )


def load_network(scenario: str) -> Network:
    """A network by short name (`worldwide`), case number (`case5`), packaged file name, or path to a JSON file.

    Raises:
        InvalidNetwork: the name is unknown, the file is unreadable, or its matrices are invalid.
    """
    data, label = load_scenario(scenario)
    return Network.from_scenario(data, name=label)


def load_scenario(scenario: str) -> tuple[dict[str, Any], str]:
    """The scenario's dict, with the links of its base network when it names one, and its label.

    Raises:
        InvalidNetwork: the name is unknown, a file is unreadable or not JSON, or a base network's devices are not
            the scenario's.
    """
    path = Path(scenario)
    if path.suffix == ".json" and path.exists():
        data, label = _read_json(path.read_text(), scenario), path.stem
    else:
        label = _short_name(scenario)
        packaged = resources.files("hetswarm.protocol").joinpath("scenarios", SCENARIOS[label]).read_text()
        data = _read_json(packaged, scenario)
    if isinstance(data, dict) and "network" in data and "latency_ms_matrix" not in data:
        base, _ = load_scenario(str(data["network"]))
        groups = [device.get("group") for device in data.get("devices", [])]
        if groups != [device["group"] for device in base["devices"]]:
            raise InvalidNetwork(f"{scenario}: its devices are not those of its network {data['network']!r}, "
                                 f"in order and by group")
        data = data | {key: base[key] for key in ("latency_ms_matrix", "bandwidth_gbps_matrix")}
    return data, label


def _read_json(text: str, scenario: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise InvalidNetwork(f"{scenario}: not valid JSON ({e})") from None


def _short_name(scenario: str) -> str:
    key = scenario.lower().removesuffix(".json")
    cases = {f"case{index}": short for index, short in enumerate(PAPER_SCENARIOS, start=1)}
    for short, file_name in SCENARIOS.items():
        if key in (short, file_name.removesuffix(".json")):
            return short
    if key in cases:
        return cases[key]
    names = ", ".join([*SCENARIOS, *cases])
    raise InvalidNetwork(f"unknown scenario {scenario!r}: give a JSON file path or one of {names}")


def _checked_matrix(label: str, matrix: Any) -> np.ndarray:
    array = np.asarray(matrix, dtype=float)
    if array.ndim != 2 or array.shape[0] != array.shape[1] or array.shape[0] == 0:
        raise InvalidNetwork(f"{label} must be a non-empty square (N, N) matrix, got shape {array.shape}")
    if not np.isfinite(array[~np.eye(len(array), dtype=bool)]).all():
        raise InvalidNetwork(f"{label} has NaN or infinite entries off the diagonal")
    if not np.allclose(array, array.T, rtol=1e-9, atol=0.0):
        d, e = np.unravel_index(np.argmax(np.abs(array - array.T)), array.shape)
        raise InvalidNetwork(f"{label} is asymmetric: [{d}, {e}] = {array[d, e]} but [{e}, {d}] = {array[e, d]}")
    return array


def _twin_classes(latency: np.ndarray, bandwidth: np.ndarray, sites: tuple[str, ...]) -> np.ndarray:
    """Class ids such that devices d, e share one only if M[d, x] == M[e, x] for every x outside {d, e}.

    Twins are looked for within a site, among devices whose rows hold the same values off the diagonal (twins' rows
    differ only in where they hold 0 and their link to each other): cheap, conservative hints; every pair is
    verified exactly.
    """
    n = len(sites)
    links = np.stack([latency, bandwidth], axis=-1)  # (N, N, 2)
    off_diagonal = ~np.eye(n, dtype=bool)
    fingerprints = np.sort(links[off_diagonal].reshape(n, n - 1, 2), axis=1)  # (N, N - 1, 2)
    candidates: dict[tuple[str, bytes], list[int]] = {}
    for d in range(n):
        candidates.setdefault((sites[d], fingerprints[d].tobytes()), []).append(d)
    classes = np.full(n, -1)
    next_class = 0
    for members in candidates.values():
        representatives: list[int] = []
        for d in members:
            for rep in representatives:
                outside = np.ones(n, dtype=bool)
                outside[[d, rep]] = False
                if np.array_equal(links[d, outside], links[rep, outside]):
                    classes[d] = classes[rep]
                    break
            else:
                representatives.append(d)
                classes[d] = next_class
                next_class += 1
    return classes


def load_hardware(scenario: str | Path) -> tuple[np.ndarray, np.ndarray] | None:
    """(tflops, memory_gib) per device from a saved view or plan (coordinator/swarm_view.py, SwarmView.to_dict), or
    from a scenario with hardware; None for a scenario without."""
    try:
        devices = load_scenario(str(scenario))[0]["devices"]
        return (np.array([float(d["tflops"]) for d in devices]), np.array([float(d["memory_gib"]) for d in devices]))
    except (InvalidNetwork, OSError, ValueError, KeyError, TypeError):
        return None
