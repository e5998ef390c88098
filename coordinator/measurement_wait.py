"""How long a plan waits for links to be measured, and which estimated links the peers are asked to measure first.

Two waits, each bounded by `measure_wait_s` and each once per membership change:

1. for the first round of measurement (protocol/measurement_policy.py): every pair in a swarm of up to k+1 peers,
   about k/2 links a peer past that;
2. past the budget, where links go unmeasured by design, for the estimated links the plan found relies on (its
   hops and its stage groups): they are asked for in the coordinator's LinkRequests record (coordinator/notices.py),
   the peers measure them as their plan's partners, and the plan found after the wait is published as its links
   then stand (the search runs again, on the measurements).
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass

from hetswarm.coordinator.planner import Proposal
from hetswarm.coordinator.swarm_view import SwarmView
from hetswarm.protocol.limits import MAX_REQUESTED_LINKS
from hetswarm.protocol.measurement_policy import DEFAULT_MAX_LINKS, expected_links

__all__ = ["MeasurementWait"]

logger = logging.getLogger(__name__)


@dataclass
class MeasurementWait:
    """The two waits of the module docstring, for one replanner."""

    wait_s: float
    requests: tuple[tuple[str, str], ...] = ()
    """The links asked for now, as (smaller id, larger id); empty when none are."""
    _asked: tuple[float, float] = (-math.inf, -math.inf)
    """(the membership change they were asked for, when)."""

    def awaited(self, view: SwarmView, now: float, changed_at: float) -> int:
        """How many links the peers should still bring before a plan is made, while the waits last."""
        measured = view.n_peers * (view.n_peers - 1) // 2 - len(view.estimated)
        if now - changed_at < self.wait_s and measured < expected_links(view.n_peers):
            return expected_links(view.n_peers) - measured
        if now - self._asked[1] >= self.wait_s:
            return 0
        index = {peer: i for i, peer in enumerate(view.peer_ids)}
        return sum((min(index[a], index[b]), max(index[a], index[b])) in view.estimated
                   for a, b in self.requests if a in index and b in index)

    def ask_first(self, proposal: Proposal | None, view: SwarmView, now: float, changed_at: float) -> bool:
        """Whether to hold `proposal` back while its estimated links are measured (module docstring)."""
        asked_before = self._asked[0] == changed_at
        wanted = () if proposal is None or asked_before or view.n_peers <= DEFAULT_MAX_LINKS + 1 else tuple(
            proposal.estimated_links()[:MAX_REQUESTED_LINKS])
        self.requests = wanted
        if wanted:
            self._asked = (changed_at, now)
            logger.info(f"The plan relies on {len(wanted)} estimated links; their peers measure them before it is "
                        "published")
        return bool(wanted)
