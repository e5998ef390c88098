"""Reports of unreachable peers, corroborated before the coordinator acts on them.

A member's Progress record may name peers of the plan it could not reach (client/training/plan_session.py). Taken on its
word, any one member could have any honest peer planned out at once, and its layers re-seeded after
`--lost-state-wait`. A report counts when a second member makes the same one, or when the reported peer does not
answer the coordinator's own ping either (client/peer/link_probe.py). A lone report that the ping contradicts turns
on its reporter, which is left out instead: it lies, or its own links fail, and a plan cannot keep it either way.
A verdict stands for `remember_s`, so the same report in the next reads costs no new ping.
"""
from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass, field

from hetswarm.protocol.keys import short_id

__all__ = ["Judged", "ReportCheck"]

logger = logging.getLogger(__name__)

REACHED_NOBODY = "unreachable: members of the plan could not reach it"


@dataclass(frozen=True, slots=True)
class Judged:
    """What the coordinator acts on: the peers to leave out, by who stands behind it (a reporter, or the
    coordinator itself for a reporter its ping contradicted), and why each is left out."""

    unreachable: dict[str, list[str]]
    reasons: dict[str, str] = field(default_factory=dict)


class ReportCheck:
    """Judges the members' unreachable reports (module docstring)."""

    def __init__(self, silent: Callable[[Collection[str]], Awaitable[set[str]]] | None, *, coordinator_id: str,
                 remember_s: float) -> None:
        """
        Args:
            silent: which of the given peers answer no ping of this coordinator; None takes every report as made.
        """
        self.silent, self.coordinator_id, self.remember_s = silent, coordinator_id, remember_s
        self._verdicts: dict[tuple[str, str], tuple[bool, float]] = {}
        """(reporter, peer) → (whether the peer failed our ping too, until when that verdict stands)."""
        self._pinged: dict[str, tuple[bool, float]] = {}
        """Peer → (whether it failed our ping, until when that stands), for `gone`."""

    async def gone(self, peers: Collection[str], now: float) -> set[str]:
        """Which of `peers` answer no ping of this coordinator (each asked at most once per `remember_s`); none
        when this check pings nobody."""
        if self.silent is None or not peers:
            return set()
        self._pinged = {peer: verdict for peer, verdict in self._pinged.items() if verdict[1] > now}
        if unasked := set(peers) - set(self._pinged):
            silent = await self.silent(unasked)
            self._pinged |= {peer: (peer in silent, now + self.remember_s) for peer in unasked}
        return {peer for peer in peers if self._pinged[peer][0]}

    async def judge(self, reports: dict[str, list[str]], now: float) -> Judged:
        """`reports` maps each reporting member to the peers of the plan it could not reach."""
        if self.silent is None or not reports:
            return Judged(unreachable=reports)
        self._verdicts = {pair: verdict for pair, verdict in self._verdicts.items() if verdict[1] > now}
        reporters: dict[str, set[str]] = {}
        for reporter, peers in reports.items():
            for peer in peers:
                reporters.setdefault(peer, set()).add(reporter)
        lone = {(next(iter(who)), peer) for peer, who in reporters.items() if len(who) == 1}
        if unjudged := {peer for _, peer in lone - set(self._verdicts)}:
            silent = await self.silent(unjudged)
            for reporter, peer in lone - set(self._verdicts):
                self._verdicts[(reporter, peer)] = (peer in silent, now + self.remember_s)
                if peer not in silent:  # logged once per verdict, not on every read of the same report
                    logger.warning(f"{short_id(reporter)} reports {short_id(peer)} unreachable, which answers our "
                                   f"ping: leaving the reporter out instead")
        unreachable: dict[str, list[str]] = {}
        reasons: dict[str, str] = {}
        for peer, who in reporters.items():
            reporter = next(iter(who))
            if len(who) > 1 or self._verdicts[(reporter, peer)][0]:
                for member in who:
                    unreachable.setdefault(member, []).append(peer)
                reasons[peer] = REACHED_NOBODY
            else:
                unreachable.setdefault(self.coordinator_id, []).append(reporter)
                reasons[reporter] = f"reported {short_id(peer)} unreachable, but it answers the coordinator's ping"
        return Judged(unreachable=unreachable, reasons=reasons)
