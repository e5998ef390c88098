"""Where each new plan's training state comes from, with what the coordinator must remember across plans to decide
it (the rules are coordinator/state_plan.py's): a decision waiting for some layers' state, since when it waits, the
plans given up for a checkpoint, and which members of the plan in force hold the state it kept."""
from __future__ import annotations

import logging
import time
from collections.abc import Mapping

from hetswarm.coordinator.checkpoint_ledger import CheckpointLedger
from hetswarm.coordinator.loss_watch import LossWatch
from hetswarm.coordinator.planner import Proposal
from hetswarm.coordinator.run_state import start_step
from hetswarm.coordinator.state_plan import StatePlan, kept_state, plan_state, rollback_state
from hetswarm.protocol.records import Assignment, PeerRecord, Progress

__all__ = ["StateSourcing"]

logger = logging.getLogger(__name__)


class StateSourcing:
    """The state plans of one coordinator run (module docstring)."""

    def __init__(self, ledger: CheckpointLedger, *, lost_state_wait_s: float) -> None:
        self.ledger, self.lost_state_wait_s = ledger, lost_state_wait_s
        self.pending: tuple[Proposal, str] | None = None
        """A decision that waits for the state of some layers."""
        self._missing_since: float | None = None
        self._abandoned: list[tuple[int, int]] = []
        """(step, version) of each plan that went back to a checkpoint (plan_state)."""
        self._kept: frozenset[str] | None = None
        """`kept_state` of the plan in force; None for a previous run's plan (all its members count as holders)."""

    def origin(self, proposal: Proposal, reason: str, *, in_force: Assignment | None, remembered_step: int,
               records: Mapping[str, PeerRecord], progress: Mapping[str, Progress]) -> StatePlan | None:
        """Where `proposal`'s state comes from; None while some layers' state is nowhere to be found (the decision
        is kept pending, and taken again next round, until `lost_state_wait_s` says those layers start again)."""
        alive = proposal.peers  # in view and not reported unreachable
        origin = plan_state(
            previous=in_force, alive=alive, records=records, progress=progress,
            live_step=start_step(in_force, progress, remembered=remembered_step, alive=alive),
            n_layers=proposal.model.n_layers, give_up=self._waited() >= self.lost_state_wait_s,
            abandoned=self._abandoned, kept=self._kept, ledger=self.ledger)
        if isinstance(origin, str):
            if self.pending is None:
                logger.warning(f"Not publishing the plan ({reason}): {origin}")
            self.pending = (proposal, reason)
            return None
        return origin

    def after_spike(self, losses: LossWatch, records: Mapping[str, PeerRecord], in_force: Proposal
                    ) -> StatePlan | None:
        """After a loss spike under `in_force` (coordinator/loss_watch.py), the newest complete checkpoint before it
        (coordinator/state_plan.py, rollback_state), the spike settled either way; None: no spike, or no such
        checkpoint (logged, and training goes on)."""
        if (spike := losses.spike()) is None:
            return None
        origin = rollback_state(records, in_force.view.peer_ids, in_force.model.n_layers, before=spike.last_good + 1,
                                why=spike.describe(), abandoned=self._abandoned, ledger=self.ledger)
        if origin is None:
            logger.warning(f"{spike.describe()}, and no complete checkpoint before it to roll back to; going on")
            losses.settle(spike, rolled_back_to=None, through_newest=True)
            return None
        logger.warning(f"{spike.describe()}: rolling back to the checkpoints of step {origin.step}")
        losses.settle(spike, rolled_back_to=origin.step)
        return origin

    def published(self, origin: StatePlan, assignment: Assignment, previous: Assignment | None) -> None:
        """Notes that `assignment` went out with `origin`'s state."""
        self.pending, self._missing_since = None, None
        if origin.handoff is not None and origin.handoff.resumed_from_checkpoint:
            self._abandoned.append((origin.step, assignment.version))
        self.ledger.follow(assignment)
        self._kept = kept_state(assignment, previous)

    def _waited(self) -> float:
        """Seconds this coordinator has been waiting for the state of some layers (0 on the first try)."""
        if self._missing_since is None:
            self._missing_since = time.monotonic()
        return time.monotonic() - self._missing_since
