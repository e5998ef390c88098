"""A single stage's next step, computed while the plan votes on this one (client/training/stage_worker.py has why).

Its passes need no frames, so once a peer has voted success it applies the step at once and computes the next
step's attempt 0 while the vote is out. Those passes count only if they ran on the weights the step will run on:
torch counts each tensor's in-place changes (`Tensor._version`, the counter autograd checks saved tensors against),
so a change of any parameter since (a rollback, a resync) shows, and the passes are then dropped.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import torch

from hetswarm.client.training.step_clock import StepClock, start_clock

__all__ = ["Ahead", "RunAhead"]

logger = logging.getLogger(__name__)


def weight_versions(module: torch.nn.Module) -> tuple[int, ...]:
    """The parameters' in-place change counters (module docstring)."""
    return tuple(param._version for param in module.parameters())


@dataclass(frozen=True, slots=True)
class Ahead:
    """A step's passes, computed while the plan voted on the step before."""

    step: int
    loss: float | None
    grads: list[torch.Tensor]
    weights: tuple[int, ...]
    """`weight_versions` when the passes ran: they count only as long as the weights are still those."""
    clock: StepClock


class RunAhead:
    """At most one step's passes in flight, on `module`'s weights as they are when it starts."""

    def __init__(self, module: torch.nn.Module,
                 passes: Callable[[int], Awaitable[tuple[float | None, list[torch.Tensor]]]]) -> None:
        """
        Args:
            passes: attempt 0's passes of a step: its loss and gradients (the optimizer's grads left cleared).
        """
        self.module, self.passes = module, passes
        self._task: asyncio.Task[Ahead] | None = None

    def start(self, step: int) -> None:
        self._task = asyncio.create_task(self._run(step))

    async def _run(self, step: int) -> Ahead:
        clock = start_clock()  # this task's own
        weights = weight_versions(self.module)
        loss, grads = await self.passes(step)
        return Ahead(step=step, loss=loss, grads=grads, weights=weights, clock=clock)

    async def take(self, step: int, attempt: int) -> Ahead | None:
        """The passes computed ahead for this attempt, once they are done; None when there are none, or they are
        for another step or attempt, failed, or ran on weights that have changed since."""
        task, self._task = self._task, None
        if task is None:
            return None
        await asyncio.wait({task})
        if task.cancelled() or task.exception() is not None:
            logger.debug(f"Passes computed ahead for step {step} are lost: "
                         f"{'cancelled' if task.cancelled() else repr(task.exception())}")
            return None
        ahead = task.result()
        return ahead if (ahead.step, attempt, ahead.weights) == (step, 0, weight_versions(self.module)) else None

    async def drop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.wait({task})
