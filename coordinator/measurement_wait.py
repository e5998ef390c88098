"""How long a plan waits for links to be measured, and which estimated links the peers are asked to measure first.

Two waits, each bounded by `measure_wait_s` and each once per membership change:

1. for the first round of measurement (protocol/measurement_policy.py): every pair in a swarm of up to k+1 peers,
   about k/2 links a peer past that;
2. past the budget, where links go unmeasured by design, for the estimated links the plan found relies on (its
   hops and its stage groups): they are asked for in the coordinator's LinkRequests record (coordinator/notices.py),
   the peers measure them as their plan's partners, and the plan found after the wait is published as its links
   then stand (the search runs again, on the measurements). A peer probes one link at a time, seconds each, so the
   coordinator names which end measures each link, spreading them as evenly as the links allow (`balanced`):
   the end with the smaller id, as for the other links, would leave one peer several asked links in a row.
"""
from __future__ import annotations

import logging
import math
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from hetswarm.coordinator.planner import Proposal
from hetswarm.coordinator.swarm_view import SwarmView
from hetswarm.protocol.keys import short_id
from hetswarm.protocol.limits import MAX_REQUESTED_LINKS
from hetswarm.protocol.measurement_policy import DEFAULT_MAX_LINKS, expected_links

__all__ = ["MeasurementWait", "balanced"]

logger = logging.getLogger(__name__)


@dataclass
class MeasurementWait:
    """The two waits of the module docstring, for one replanner."""

    wait_s: float
    requests: tuple[tuple[str, str], ...] = ()
    """The links asked for now, as (measurer, target); empty when none are."""
    _asked: tuple[float, float] = (-math.inf, -math.inf)
    """(the membership change they were asked for, when)."""

    def awaited(self, view: SwarmView, now: float, changed_at: float) -> str:
        """The links the peers should still bring before a plan is made, while the waits last, for the log (the
        last few asked links by name: whose probes hold the plan); empty when none are."""
        measured = view.n_peers * (view.n_peers - 1) // 2 - len(view.estimated)
        if now - changed_at < self.wait_s and measured < expected_links(view.n_peers):
            return f"{expected_links(view.n_peers) - measured} links"
        if now - self._asked[1] >= self.wait_s:
            return ""
        index = {peer: i for i, peer in enumerate(view.peer_ids)}
        pending = [(a, b) for a, b in self.requests
                   if a in index and b in index and (min(index[a], index[b]), max(index[a], index[b])) in view.estimated]
        named = ", ".join(f"{short_id(a)} → {short_id(b)}" for a, b in pending)
        return "" if not pending else f"{len(pending)} asked links" + (f" ({named})" if len(pending) <= 4 else "")

    def ask_first(self, proposal: Proposal | None, view: SwarmView, now: float, changed_at: float) -> bool:
        """Whether to hold `proposal` back while its estimated links are measured (module docstring)."""
        asked_before = self._asked[0] == changed_at
        wanted = () if proposal is None or asked_before or view.n_peers <= DEFAULT_MAX_LINKS + 1 else tuple(
            proposal.estimated_links()[:MAX_REQUESTED_LINKS])
        self.requests = balanced(wanted)
        if wanted:
            self._asked = (changed_at, now)
            logger.info(f"The plan relies on {len(wanted)} estimated links; their peers measure them before it is "
                        "published")
        return bool(wanted)


def balanced(pairs: Iterable[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    """`pairs` as (measurer, target), so that the most links any one peer measures is as few as it can be.

    Starts from the first peer of each pair, then, while a peer with the most links measures a chain of links that
    ends at a peer with at least two fewer, turns that chain around: the first peer measures one link fewer, the
    last one more, those between as many. When no such chain is left, the peers reachable along links measured
    from the busiest ones measure the most or one fewer each, and only links among themselves: more than (most − 1)
    links a peer among them, so that any choice of measurers leaves one of them the most.
    """
    measurer = {pair: pair[0] for pair in dict.fromkeys(pairs)}
    while chain := _chain_to_lighter(measurer):
        for a, b in chain:
            measurer[a, b] = _other_end((a, b), measurer[a, b])
    return tuple((m, _other_end(pair, m)) for pair, m in measurer.items())


def _other_end(pair: tuple[str, str], peer: str) -> str:
    return pair[1] if peer == pair[0] else pair[0]


def _chain_to_lighter(measurer: dict[tuple[str, str], str]) -> list[tuple[str, str]]:
    """The links of a chain from a peer with the most links to one with two fewer or less (breadth first); none
    when no such chain exists."""
    load = Counter(measurer.values())
    measures = defaultdict(list)
    for pair, m in measurer.items():
        measures[m].append((pair, _other_end(pair, m)))
    most = max(load.values(), default=0)
    for start in sorted(peer for peer, n in load.items() if n == most):
        came_by = {start: None}
        queue = [start]
        for peer in queue:
            for pair, target in measures[peer]:
                if target in came_by:
                    continue
                came_by[target] = (peer, pair)
                if load[target] <= most - 2:
                    chain = []
                    while came_by[target] is not None:
                        target, pair = came_by[target]
                        chain.append(pair)
                    return chain
                queue.append(target)
    return []
