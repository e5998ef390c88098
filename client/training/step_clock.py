"""Where one step's time goes on this peer: compute, waiting for neighbours and the group, and the neighbour timings
the coordinator corroborates claims with (coordinator/claims.py).

The clock of the step a task works on is a context variable: a single stage computes the next step's passes in a
task of its own beside the step before (client/training/run_ahead.py), and must not charge its time to that step.
"""
from __future__ import annotations

import contextvars
import logging
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import TypeVar

__all__ = ["StepClock", "current_clock", "mark", "start_clock", "waiting"]

T = TypeVar("T")

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class StepClock:
    """Compute, waiting, and (event, perf_counter) marks for the debug log."""

    started: float = field(default_factory=time.perf_counter)
    compute_s: float = 0.0
    wait_s: float = 0.0
    timeline: list[tuple[str, float]] = field(default_factory=list)
    window_s: float = 0.0
    """Summed over the attempt's micro-batches: from an activation's arrival to its gradient's send upstream."""
    round_trip_s: float = 0.0
    """Summed over the attempt's micro-batches: from an activation's send downstream to its gradient's arrival."""
    arrived: dict[int, float] = field(default_factory=dict)
    sent: dict[int, float] = field(default_factory=dict)

    def new_attempt(self) -> None:
        """Neighbour timings count the committed attempt only."""
        self.window_s = self.round_trip_s = 0.0
        self.arrived.clear()
        self.sent.clear()

    def log_timeline(self, what: str, wall_clock: float) -> None:
        """The marks at debug level, relative to the start; `wall_clock`: time.time() at the start."""
        if logger.isEnabledFor(logging.DEBUG):  # built only when shown: this runs every step
            logger.debug(f"{what} from {wall_clock:.3f} (wall clock): " + ", ".join(
                f"{event} {at - self.started:+.3f}" for event, at in sorted(self.timeline, key=lambda e: e[1])))

    def add(self, earlier: StepClock) -> None:
        """Counts passes computed ahead, on `earlier`, as this step's."""
        self.started = min(self.started, earlier.started)
        self.compute_s += earlier.compute_s
        self.timeline += [(f"ahead {event}", at) for event, at in earlier.timeline]


_CLOCK: contextvars.ContextVar[StepClock] = contextvars.ContextVar("hetswarm_step_clock")


def start_clock() -> StepClock:
    """A new clock for the running task (and the tasks it creates from now on)."""
    clock = StepClock()
    _CLOCK.set(clock)
    return clock


def current_clock() -> StepClock:
    return _CLOCK.get()


def mark(event: str) -> None:
    _CLOCK.get().timeline.append((event, time.perf_counter()))


async def waiting(awaitable: Awaitable[T]) -> T:
    """`await awaitable`, its time counted as waiting."""
    started, clock = time.perf_counter(), _CLOCK.get()
    try:
        return await awaitable
    finally:
        clock.wait_s += time.perf_counter() - started
