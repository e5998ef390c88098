"""Loss spikes: a step whose loss jumps far above the run's recent losses sends the swarm back to a checkpoint.

A corrupted replica (a bit flip on a volunteer's GPU, a member that slipped poisoned values past the checks) can
wreck the model in one step. The coordinator sees every pipeline's loss in its last stage's Progress records, each
of which carries its last steps' too; only those members compute a loss, so only theirs count. When the losses of
two pipelines (of the only one, in a plan of one) at a step exceed `threshold` times the recent median (over the
`window` steps before it, of each step's median over pipelines), the coordinator plans the same roles again from the
newest complete checkpoint of a step whose loss it saw and found normal (coordinator/state_plan.py), and says so in
the plan's reason. One member's word cannot force a rollback: a lie about its own pipeline's loss moves no median
and makes no second spike. The spike's step and those before it are then settled: should the same data bring the
same spike again, it is a property of the run, not a fault, and training goes on.
"""
from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field

from hetswarm.protocol.errors import ConfigError
from hetswarm.protocol.records import Assignment, Progress

__all__ = ["LossSpike", "LossWatch"]


@dataclass(frozen=True, slots=True)
class LossSpike:
    step: int
    loss: float
    median: float
    last_good: int
    """The newest step before the spike whose loss the coordinator saw, and was not one (a record that was
    replaced before it was read can leave a gap). A checkpoint taken at or before this step was trained only on
    good steps."""

    def describe(self) -> str:
        return f"loss spike at step {self.step} ({self.loss:.3g} against a recent median of {self.median:.3g})"


@dataclass
class LossWatch:
    threshold: float = 2.0
    """A step's loss above this multiple of the recent median is a spike; 0 turns the watch off."""
    window: int = 20
    """Steps before a step that make its recent median."""
    min_history: int = 5
    """Steps needed before any step can be judged."""
    _losses: dict[int, dict[str, float]] = field(default_factory=dict)
    """Step → last-stage member → its pipeline's loss."""
    _pipelines: int = 1
    """Pipelines of the plan watched: a spike needs min(2, this) of them."""
    _settled: int = -1
    """Steps up to here are not judged again (module docstring)."""

    def __post_init__(self) -> None:
        if self.threshold != 0 and self.threshold <= 1 or self.window < 1 or self.min_history < 1:
            raise ConfigError(f"need a spike threshold above 1 (or 0 for none), window >= 1 and min_history >= 1, "
                              f"got {self.threshold}, {self.window} and {self.min_history}")

    def observe(self, plan: Assignment, progress: Mapping[str, Progress]) -> None:
        """Takes in the losses the last-stage members of `plan` report, each record's recent steps included."""
        self._pipelines = plan.d_dp
        for signer, record in progress.items():
            role = plan.roles.get(signer)
            if (signer == record.peer_id and role is not None and role.stage == plan.d_pp - 1
                    and record.assignment_version == plan.version and record.health == "training"
                    and record.loss is not None):
                recent = record.recent_losses or [record.loss]
                for step, loss in enumerate(recent, start=record.step - len(recent) + 1):
                    if step >= plan.step:  # steps before the plan's start are another plan's
                        self._losses.setdefault(step, {})[signer] = loss
        if len(self._losses) > 4 * self.window:
            for step in sorted(self._losses)[:-2 * self.window]:
                del self._losses[step]

    def spike(self) -> LossSpike | None:
        """The earliest unsettled step at which enough pipelines' losses spike (module docstring), if any."""
        if self.threshold == 0:
            return None
        steps = sorted(self._losses)
        for index, step in enumerate(steps):
            before = steps[max(0, index - self.window):index]
            if step <= self._settled or len(before) < self.min_history:
                continue
            median = statistics.median(statistics.median(self._losses[s].values()) for s in before)
            high = [loss for loss in self._losses[step].values() if loss > self.threshold * median]
            if len(high) >= min(2, self._pipelines):
                return LossSpike(step=step, loss=min(high), median=median, last_good=before[-1])
        return None

    def settle(self, spike: LossSpike, *, rolled_back_to: int | None, through_newest: bool = False) -> None:
        """Marks the spike handled (`through_newest`: and every step seen so far, when nothing can be done about
        it); after a rollback, the losses from the checkpoint on are reported afresh."""
        self._settled = max(spike.step, max(self._losses, default=spike.step) if through_newest else spike.step)
        if rolled_back_to is not None:
            self._losses = {step: losses for step, losses in self._losses.items() if step < rolled_back_to}
