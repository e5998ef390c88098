"""The peers' records as a reader keeps them between reads, so that "gone" is told from "not read".

A read of a busy DHT may return part of the swarm: the nodes asked in time did not all hold every subkey. Taken as
the view, such a read makes live peers look departed: the coordinator replanned them out (seen at 16 clients on
one machine: "7 left … no plan fits 9 peers" while all 16 trained), and volunteers forgot their measurements of
them and probed them again past their budget (seen at 32 clients: views of 22, 14, 7 and 5 peers within a minute).
So a peer stays in view until its record expires (the owner stopped refreshing it: it died or left), until a newer
record of it says so (`leaving`, which planning and probing skip), or, for the coordinator, until the plan's
members report it unreachable (coordinator/reports.py, which the replanner acts on). A later read's record of a
peer replaces an older one.
"""
from __future__ import annotations

from collections.abc import Collection, Mapping

from hivemind.utils import get_dht_time

from hetswarm.protocol.keys import PEERS_FIELD
from hetswarm.protocol.limits import DHT_BEAM_SIZE, MAX_RECORDS_PER_KEY
from hetswarm.protocol.record_store import SwarmRecords, kept_first
from hetswarm.protocol.records import PeerRecord

__all__ = ["RememberedPeers"]


class RememberedPeers:
    """Every peer record read and not yet expired, the newest of each peer."""

    def __init__(self, limit: int = MAX_RECORDS_PER_KEY) -> None:
        """`limit`: the most records kept, ranked as a read ranks them (protocol/record_store.py: `kept_first`), so
        that reads of different nodes do not add up to a flood."""
        self.limit = limit
        self._records: dict[str, tuple[PeerRecord, float]] = {}
        """Peer → (its newest record, the DHT time it expires)."""

    def merge(self, read: Mapping[str, tuple[PeerRecord, float]], now: float, *, prefer: Collection[str] = ()
              ) -> dict[str, PeerRecord]:
        """The view after `read` (records with their expiry, as SwarmRecords.read_expiring gives them) at DHT time
        `now`: what it brought, and what earlier reads brought that has not expired; past the limit, the records
        of the `prefer`red peers (the plan's) first."""
        for peer, (record, expires) in read.items():
            known = self._records.get(peer)
            if known is None or record.updated_at >= known[0].updated_at:
                self._records[peer] = (record, expires)
        live = sorted(((peer, kept) for peer, kept in self._records.items() if kept[1] > now),
                      key=lambda item: kept_first(item[0], item[1][0].updated_at, prefer=prefer, now=now), reverse=True)
        self._records = dict(live[:self.limit])
        return {peer: record for peer, (record, _) in self._records.items()}

    async def read(self, records: SwarmRecords, *, prefer: Collection[str] = (), beam_size: int = DHT_BEAM_SIZE
                   ) -> dict[str, PeerRecord]:
        """The view after one more read of the swarm's peer records, of `beam_size` nodes (TimeoutError when the
        read timed out); a volunteer's polls read VIEW_BEAM_SIZE."""
        read = await records.read_expiring(PEERS_FIELD, prefer=prefer, beam_size=beam_size)
        return self.merge(read, get_dht_time(), prefer=prefer)
