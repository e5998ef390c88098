"""The coordinator's Refusals record: the peers it does not plan and those it prices by what they do, with its
reasons, for the monitor and for the peers themselves (`hetswarm monitor` shows them)."""
from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping

from hivemind.utils import get_dht_time

from hetswarm.protocol.limits import MAX_REFUSED_PER_RECORD
from hetswarm.protocol.record_store import SwarmRecords
from hetswarm.protocol.records import Refusals

__all__ = ["RefusalsBoard"]

logger = logging.getLogger(__name__)


class RefusalsBoard:
    """Publishes the record at each change, and every TTL/2 while it names anyone; logs each newly named peer."""

    def __init__(self, records: SwarmRecords, *, coordinator_id: str, ttl_s: float) -> None:
        self.records, self.coordinator_id, self.ttl_s = records, coordinator_id, ttl_s
        self._published: tuple[dict[str, str], dict[str, str]] = ({}, {})
        """The refused and the flagged peers last published."""
        self._published_at = -math.inf

    async def publish(self, refused: Mapping[str, str], flagged: Mapping[str, str]) -> None:
        refused, flagged = _bounded(refused), _bounded(flagged)
        due = time.monotonic() - self._published_at >= self.ttl_s / 2
        if (refused, flagged) == self._published and not ((refused or flagged) and due):
            return
        for peer, why in (refused | flagged).items():
            if peer not in self._published[0] and peer not in self._published[1]:
                logger.warning(f"Peer {peer}: {why}")
        record = Refusals(coordinator_id=self.coordinator_id, refused=refused, flagged=flagged,
                          updated_at=get_dht_time())
        try:
            stored = await self.records.publish(record, ttl_s=self.ttl_s)
        except TimeoutError:
            stored = False
        if stored:
            self._published, self._published_at = (refused, flagged), time.monotonic()


def _bounded(reasons: Mapping[str, str]) -> dict[str, str]:
    """The first MAX_REFUSED_PER_RECORD peers by id, each reason cut to what a Refusals record holds."""
    return {peer: why[:160] for peer, why in sorted(reasons.items())[:MAX_REFUSED_PER_RECORD]}
