"""The plan the swarm follows, as the coordinator's one copy of it: the published assignment, this run's pricing of
it, and where it came from. The replanner (coordinator/replanner.py) is handed it each round and keeps none; the
state file (coordinator/run_state.py) persists its assignment, so a restarted coordinator starts from a `recovered`
plan and learns from the peers' records what becomes of it (coordinator/recovery.py)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from hetswarm.coordinator.planner import Proposal
from hetswarm.protocol.records import Assignment

__all__ = ["Origin", "PlanInForce"]

Origin = Literal["this run", "recovered", "adopting", "previous run"]
"""`this run`: published by this run, which refreshes it and watches its members. The other three are a previous
run's plan, read back from the state file or the DHT: `recovered` until the peers' records are read, then `adopting`
(its peers follow it and it fits this run: the replanner publishes it again as it is once they are in view) or
`previous run` (superseded, or made for another model or shape: planned afresh, its step and state still count)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class PlanInForce:
    assignment: Assignment
    """As published, signed by this coordinator's key."""
    origin: Origin
    pricing: Proposal | None = field(default=None, compare=False)
    """The priced proposal it was built from; None for a previous run's plan, which this run has not priced. Not
    compared: it holds numpy arrays, and the assignment says what the swarm follows."""

    def __post_init__(self) -> None:
        if (self.origin == "this run") != (self.pricing is not None):
            raise ValueError(f"a plan of this run has a pricing and a previous run's has none, got {self.origin!r} "
                             f"with pricing {'set' if self.pricing is not None else 'None'}")

    @property
    def ours(self) -> bool:
        """Whether this run published it (module docstring)."""
        return self.origin == "this run"
