"""Peer records made by hand, for tests of what the coordinator reads."""
from __future__ import annotations

from hivemind.utils import get_dht_time

from hetswarm.protocol.records import Hardware, LinkMeasurement, PeerRecord

IDS = [f"Qm{c * 44}" for c in "ABCDEFGHJK"]
"""Valid, sorted peer ids."""


def link(latency_ms: float, bandwidth_mbps: float) -> LinkMeasurement:
    return LinkMeasurement(latency_ms=float(latency_ms), bandwidth_mbps=float(bandwidth_mbps), measured_at=0.0,
                           samples=5)


def record(peer: str, *, links: dict | None = None, site: str | None = None, state: str = "ready",
           tflops: float = 1.0, memory_gib: float = 4.0) -> PeerRecord:
    hardware = Hardware(device="cpu", device_name="test", tflops=tflops, dtype="float32", memory_gib=memory_gib)
    return PeerRecord(peer_id=peer, maddrs=[], version="t", hardware=hardware, links=links or {}, state=state,
                      site=site, updated_at=0.0)


def make_record(peer_id: str, *, name: str = "honest", tflops: float = 1.0) -> PeerRecord:
    """A record as a volunteer would publish it now (for tests that store it in a real DHT)."""
    hardware = Hardware(device="cpu", device_name="test cpu", tflops=tflops, dtype="float32", memory_gib=1.0)
    return PeerRecord(
        peer_id=peer_id, maddrs=[], version="test", hardware=hardware, state="ready",
        public_name=name, updated_at=get_dht_time(),
    )
