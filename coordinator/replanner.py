"""Deciding when a new plan is worth a new assignment version, and which plan (proposals: coordinator/planner.py).

The replanner publishes a new version when the set of trainable peers changed and then stayed put for the debounce
time (and, within a bound, until their links are measured: coordinator/measurement_wait.py), or when, on the same
peers, a fresh plan is predicted at least `improvement` faster than the current plan re-priced on the fresh
measurements (hysteresis, so that measurement noise does not make the swarm thrash).

Re-plans are sticky (coordinator/sticky.py): the plan in force with its gone peers replaced is kept unless the
search's plan is `improvement` faster and wins back the state hand-off of the peers it moves within
`payback_steps` steps; the reason names the peers that move.

A restarted coordinator adopts the plan in force instead of planning afresh (`fits`): a new plan would reshuffle
peers that are training well, and their stages would lose what they learned. The plan is taken over as it is as
soon as all its peers are in view; if some of them left meanwhile, the survivors are preferred in the replan that
follows.

The replanner keeps no plan: the coordinator hands it the plan in force each round (coordinator/plan_in_force.py),
so what it decides from is what the swarm follows, also when a decision is not published.
"""
from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import numpy as np

from hetswarm.coordinator.measurement_wait import MeasurementWait
from hetswarm.coordinator.plan_in_force import PlanInForce
from hetswarm.coordinator.planner import PlannerConfig, Proposal, deployed, propose, reprice
from hetswarm.coordinator.reports import REACHED_NOBODY
from hetswarm.coordinator.scheduling.live_cost import Execution, NoFeasiblePlan
from hetswarm.coordinator.sticky import sticky_or_searched
from hetswarm.coordinator.swarm_view import SwarmView, build_view, trainable_peers
from hetswarm.protocol.keys import short_id, short_ids
from hetswarm.protocol.records import Assignment, PeerRecord

__all__ = ["Replanner"]

logger = logging.getLogger(__name__)


@dataclass
class Replanner:
    """Decides, from the peers' records and the plan in force it is handed, when to publish which plan."""

    config: PlannerConfig
    _members: frozenset[str] = frozenset()
    _changed_at: float = -math.inf
    _considered_at: float = -math.inf
    _last_refusal: str = ""
    _suspects: dict[str, tuple[float, str]] = field(default_factory=dict)
    """Peer → until when (monotonic) it is left out, and why (coordinator/reports.py)."""
    trusted: frozenset[str] | None = None
    """Peers whose claims their reports confirmed, as the coordinator last judged them (coordinator/claims.py);
    None trusts every peer."""
    _trouble: str = ""
    """Why the plan must change now (unreachable peers) or be restarted (stalled members); empty when all is well."""
    _restarted_at: float = -math.inf
    measuring: MeasurementWait = field(init=False)
    """The waits for links to be measured, and the links asked for (coordinator/measurement_wait.py)."""

    def __post_init__(self) -> None:
        self.measuring = MeasurementWait(self.config.measure_wait_s)

    def fits(self, assignment: Assignment) -> bool:
        """Whether a previous run's plan may be adopted, so that a restart keeps the roles; False (and logged) when
        it was made for another model or shape than this run's config asks for. An adopted plan (origin `adopting`,
        coordinator/plan_in_force.py) is published again as it is once all its peers are in view (no debounce, no
        `min_peers`: the swarm was already training); peers of it that left are replanned out after the debounce,
        as any membership change, with the survivors preferred."""
        if (reason := _reason_not_to_adopt(assignment, self.config)) is not None:
            logger.info(f"Not adopting plan v{assignment.version}: {reason}; planning afresh")
            return False
        return True

    def note_trouble(self, *, unreachable: dict[str, list[str]], stalled: dict[str, str], now: float,
                     reasons: Mapping[str, str] | None = None) -> None:
        """What the plan's members report (client/training/plan_session.py), as the coordinator judged it
        (coordinator/reports.py, coordinator/failure_votes.py): `unreachable` maps whoever stands behind it (a
        reporter, or this coordinator) to the peers to leave out, `reasons` says why each,
        `stalled` maps a member that gave up to its reason. An unreachable peer is left out at once (no debounce:
        the plan cannot train with it); stalled members get the plan restarted."""
        fresh = {peer for peers in unreachable.values() for peer in peers
                 if self._suspects.get(peer, (-math.inf, ""))[0] <= now}
        for peer in fresh:
            self._suspects[peer] = (now + self.config.suspect_s, (reasons or {}).get(peer, REACHED_NOBODY))
        if fresh:
            self._trouble = f"{short_ids(frozenset(fresh))} ({self._suspects[min(fresh)][1]})"
            logger.warning(f"Leaving {short_ids(frozenset(fresh))} out and re-planning: " + "; ".join(
                f"{short_id(peer)} {self._suspects[peer][1]}" for peer in sorted(fresh)))
        elif stalled and not self._trouble and now - self._restarted_at >= self.config.retry_s:
            self._trouble = f"stalled: {short_ids(frozenset(stalled))} ({next(iter(stalled.values()))[:80]})"

    def left_out(self, now: float) -> dict[str, str]:
        """Peers left out of planning for now, with the reason (for the coordinator's Refusals record)."""
        return {peer: f"left out for {until - now:.0f} s more: {why}"
                for peer, (until, why) in self._suspects.items() if until > now}

    def decide(self, records: dict[str, PeerRecord], now: float, *, in_force: PlanInForce | None,
               waiting: Proposal | None = None) -> tuple[Proposal, str] | None:
        """A proposal and the reason to publish it now, or None to keep the plan in force (each choice logged).

        Args:
            in_force: the plan the swarm follows (coordinator/plan_in_force.py); a previous run's counts only while
                `adopting`.
            waiting: a decision not published yet because some layers' state is missing
                (coordinator/state_sourcing.py); decisions go on from it, as from a published one.
        """
        self._suspects = {peer: suspect for peer, suspect in self._suspects.items() if suspect[0] > now}
        records = {peer: record for peer, record in records.items() if peer not in self._suspects}  # not even standby
        members = frozenset(trainable_peers(records))
        if members != self._members:
            self._members, self._changed_at = members, now
        current = waiting or (in_force.pricing if in_force is not None else None)
        basis = current or (in_force.assignment if in_force is not None and in_force.origin == "adopting" else None)
        if self._trouble and basis is not None:
            return self._recover(records, members, now, basis)
        if current is None and basis is not None:
            return self._adopt(records, members, now, basis)
        if current is None and len(members) < self.config.min_peers:
            self._refuse(f"Waiting for {self.config.min_peers} trainable peers, {len(members)} in view", logging.INFO)
            return None
        if current is not None and members == current.peers:
            return self._reconsider(records, now, current)
        if now - self._changed_at < self.config.debounce_s or not members:
            return None
        view = build_view(records)
        if awaited := self.measuring.awaited(view, now, self._changed_at):
            self._refuse(f"Waiting for {awaited} to be measured", logging.INFO)
            return None
        if current is None:
            reason = f"initial plan for {len(members)} peers"
        else:
            joined, left = members - current.peers, current.peers - members
            reason = (f"membership changed: {len(joined)} joined {short_ids(joined)}, {len(left)} left {short_ids(left)}")
        decision = self._propose(view, reason, now, current)
        held = self.measuring.ask_first(decision and decision[0], view, now, self._changed_at)
        return None if held else decision

    def _recover(self, records: dict[str, PeerRecord], members: frozenset[str], now: float, basis: Basis
                 ) -> tuple[Proposal, str] | None:
        """Acts on trouble at once: without the unreachable peers, or the same plan again for stalled members."""
        trouble, self._trouble = self._trouble, ""
        if members == _peers(basis):  # nobody to leave out: restart the plan as it is
            self._restarted_at = self._considered_at = now
            return self._as_it_is(records, basis), f"restart from the last committed step; {trouble}"
        if not members:
            self._refuse(f"no trainable peer left after {trouble}")
            return None
        view = build_view(records).subset(sorted(members))
        return self._propose(view, f"re-planned without {trouble}", now, basis)

    def _adopt(self, records: dict[str, PeerRecord], members: frozenset[str], now: float, in_force: Assignment
               ) -> tuple[Proposal, str] | None:
        """The plan in force as it is once all its peers are in view; else, after the debounce, a replan that prefers
        its surviving peers."""
        placed = _placed(in_force)
        if placed <= members:
            self._considered_at, self._last_refusal = now, ""
            return self._as_it_is(records, in_force), f"adopted plan v{in_force.version} after a coordinator restart"
        self._refuse(f"Waiting for {len(placed - members)} peer(s) of plan v{in_force.version} "
                     f"{short_ids(placed - members)}", logging.INFO)
        if now - self._changed_at < self.config.debounce_s or not members:
            return None
        view = build_view(records)
        if self.measuring.awaited(view, now, self._changed_at):
            return None
        joined, left = members - placed, placed - members
        reason = (f"membership changed since v{in_force.version}: {len(joined)} joined {short_ids(joined)}, "
                  f"{len(left)} left {short_ids(left)}")
        return self._propose(view, reason, now, in_force, prefer=placed & members)

    def _as_it_is(self, records: dict[str, PeerRecord], basis: Basis) -> Proposal:
        """`basis` again, a previous run's plan priced on the peers in view."""
        if isinstance(basis, Proposal):
            return basis
        return deployed(build_view(records), basis.pipelines, self.config.model, [basis.wire_format()], _runs(basis))

    def _reconsider(self, records: dict[str, PeerRecord], now: float, current: Proposal
                    ) -> tuple[Proposal, str] | None:
        if now - self._considered_at < self.config.reconsider_s:
            return None
        self._considered_at = now
        view = build_view(records)
        placed = view.subset(list(current.view.peer_ids))
        if (np.array_equal(placed.network.latency_ms, current.view.network.latency_ms)
                and np.array_equal(placed.network.bandwidth_gbps, current.view.network.bandwidth_gbps)
                and np.array_equal(placed.tflops, current.view.tflops)):
            return None
        repriced = reprice(current, view).live.total_s
        try:
            fresh = propose(view, self.config, prefer=_placed(current))
        except NoFeasiblePlan as e:
            self._refuse(f"Keeping the current plan: {e}")
            return None
        chosen, why = sticky_or_searched(view, fresh, current.pipelines, current.execution, self.config)
        if chosen is not fresh:
            logger.info(f"Kept the plan: a fresh one is predicted at {fresh.live.total_s:.3f} s vs {repriced:.3f} s "
                        f"now, which does not clear the {self.config.improvement:.0%} threshold or pay for its moves")
            return None
        return fresh, f"better plan predicted: {fresh.live.total_s:.3f} s vs {repriced:.3f} s; {why}"

    def _propose(self, view: SwarmView, reason: str, now: float, basis: Basis | None, *,
                 prefer: frozenset[str] | None = None) -> tuple[Proposal, str] | None:
        """The search's plan, or `basis` with its gaps filled when the search's does not pay for its moves."""
        if prefer is None:
            prefer = _placed(basis) if basis is not None else frozenset()
        try:
            searched = propose(view, self.config, prefer=prefer, trusted=self.trusted)
        except NoFeasiblePlan as e:
            self._refuse(f"{reason}, but {e}")
            return None
        proposal, why = (sticky_or_searched(view, searched, basis.pipelines, _runs(basis), self.config)
                         if basis is not None else (searched, ""))
        self._considered_at, self._last_refusal = now, ""
        return proposal, f"{reason}; {why}" if why else reason

    def _refuse(self, message: str, level: int = logging.WARNING) -> None:
        if message != self._last_refusal:  # once per situation, not once per poll
            self._last_refusal = message
            logger.log(level, message)


Basis = Proposal | Assignment
"""What a decision goes on from: this run's priced plan, or a previous run's plan being adopted."""


def _placed(basis: Basis) -> frozenset[str]:
    return frozenset(basis.view.peer_ids) if isinstance(basis, Proposal) else frozenset(basis.roles)


def _peers(basis: Basis) -> frozenset[str]:
    """Every peer `basis` speaks for, placed or standby."""
    return basis.peers if isinstance(basis, Proposal) else frozenset(basis.roles)


def _runs(basis: Basis) -> Execution:
    return basis.execution if isinstance(basis, Proposal) else Execution.of_assignment(basis)


def _reason_not_to_adopt(assignment: Assignment, config: PlannerConfig) -> str | None:
    """Why a previous run's plan does not fit this run's config, or None."""
    try:
        model = assignment.model_config()
    except (TypeError, ValueError) as e:
        return f"its model config is invalid ({e})"
    if replace(model, micro_batches=config.model.micro_batches) != config.model:  # a plan may need more
        return f"it trains {model.name!r} with other settings than this run's {config.model.name!r}"
    for name, fixed, found in (("d_dp", config.d_dp, assignment.d_dp),
                               ("d_pp", config.d_pp, assignment.d_pp)):
        if fixed is not None and fixed != found:
            return f"it has {name}={found}, this run asks for {fixed}"
    return None
