"""The coordinator's notices to the swarm, besides its plan: the Refusals record (the peers it does not plan and
those it prices by what they do, with its reasons: `hetswarm monitor` shows them, the peers read their own) and the
LinkRequests record (the estimated links a plan it is about to publish relies on: the peers measure them first)."""
from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Collection, Mapping

from hivemind.utils import get_dht_time

from hetswarm.protocol.limits import MAX_REFUSED_PER_RECORD
from hetswarm.protocol.record_store import SwarmRecords
from hetswarm.protocol.records import LinkRequests, Refusals

__all__ = ["Notices"]

logger = logging.getLogger(__name__)


class _Board:
    """One record of ours, published at each change of what it says and every TTL/2 while it says anything: it
    lives as long as it matters, and an emptied one replaces the last that said something."""

    def __init__(self, records: SwarmRecords, ttl_s: float) -> None:
        self.records, self.ttl_s = records, ttl_s
        self.shown: object = None
        """What the record last stored says."""
        self._published_at = -math.inf

    async def show(self, says: object, record: Callable[[], Refusals | LinkRequests]) -> None:
        due = time.monotonic() - self._published_at >= self.ttl_s / 2
        if says == self.shown and not (says and due):
            return
        try:
            stored = await self.records.publish(record(), ttl_s=self.ttl_s)
        except TimeoutError:
            stored = False
        if stored:
            self.shown, self._published_at = says, time.monotonic()


class Notices:
    """The Refusals and LinkRequests records of one coordinator; logs each newly refused or flagged peer."""

    def __init__(self, records: SwarmRecords, *, coordinator_id: str, ttl_s: float) -> None:
        self.coordinator_id = coordinator_id
        self._refusals, self._requests = _Board(records, ttl_s), _Board(records, ttl_s)

    async def publish(self, refused: Mapping[str, str], flagged: Mapping[str, str],
                      requests: Collection[tuple[str, str]]) -> None:
        refused, flagged = _bounded(refused), _bounded(flagged)
        known = self._refusals.shown or ({}, {})
        for peer, why in (refused | flagged).items():
            if peer not in known[0] and peer not in known[1]:
                logger.warning(f"Peer {peer}: {why}")
        await self._refusals.show((refused, flagged) if refused or flagged else None, lambda: Refusals(
            coordinator_id=self.coordinator_id, refused=refused, flagged=flagged, updated_at=get_dht_time()))
        pairs = sorted(requests)
        await self._requests.show(tuple(pairs) or None, lambda: LinkRequests(
            coordinator_id=self.coordinator_id, pairs=pairs, updated_at=get_dht_time()))


def _bounded(reasons: Mapping[str, str]) -> dict[str, str]:
    """The first MAX_REFUSED_PER_RECORD peers by id, each reason cut to what a Refusals record holds."""
    return {peer: why[:160] for peer, why in sorted(reasons.items())[:MAX_REFUSED_PER_RECORD]}
