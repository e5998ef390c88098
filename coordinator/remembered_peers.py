"""The peers' records as the coordinator keeps them between reads, so that "gone" is told from "not read".

A read of a busy DHT may return part of the swarm: the nodes asked in time did not all hold every subkey. Taken as
the view, such a read makes live peers look departed, and the coordinator replans them out (seen at 16 clients on
one machine: "7 left … no plan fits 9 peers" while all 16 trained). So a peer stays in view until its record
expires (the owner stopped refreshing it: it died or left), until a newer record of it says so (`leaving`, which
planning skips like any state that does not train), or until the plan's members report it unreachable
(coordinator/reports.py, which the replanner acts on). A later read's record of a peer replaces an older one.
"""
from __future__ import annotations

from collections.abc import Mapping

from hetswarm.protocol.records import PeerRecord

__all__ = ["RememberedPeers"]


class RememberedPeers:
    """Every peer record read and not yet expired, the newest of each peer."""

    def __init__(self) -> None:
        self._records: dict[str, tuple[PeerRecord, float]] = {}
        """Peer → (its newest record, the DHT time it expires)."""

    def merge(self, read: Mapping[str, tuple[PeerRecord, float]], now: float) -> dict[str, PeerRecord]:
        """The view after `read` (records with their expiry, as SwarmRecords.read_expiring gives them) at DHT time
        `now`: what it brought, and what earlier reads brought that has not expired."""
        for peer, (record, expires) in read.items():
            known = self._records.get(peer)
            if known is None or record.updated_at >= known[0].updated_at:
                self._records[peer] = (record, expires)
        self._records = {peer: kept for peer, kept in self._records.items() if kept[1] > now}
        return {peer: record for peer, (record, _) in self._records.items()}
