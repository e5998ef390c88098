"""What this peer says of its training in its Progress records, and their publishing in the background.

A record after every committed step carries the step, its loss, its speed and where the stage's state came from,
plus what the coordinator corroborates with it: the losses of the last consecutive steps (coordinator/loss_watch.py),
the newest held-out loss (client/peer/held_out.py), the neighbour timings (coordinator/claims.py), and the signed
failure votes of aborted attempts (coordinator/failure_votes.py). A record of trouble says at once that this peer
cannot train a step, why, and which peers of the plan it could not reach.
"""
from __future__ import annotations

import asyncio
import collections
import contextlib
import logging

from hivemind.utils import get_dht_time

from hetswarm.client.peer.node import SwarmNode
from hetswarm.client.training.errors import StageError
from hetswarm.client.training.stage_worker import StageWorker, StepReport
from hetswarm.client.training.state_handoff import HandoffReport
from hetswarm.protocol.limits import MAX_LOSS, MAX_RECENT_LOSSES, MAX_UNREACHABLE_PER_RECORD
from hetswarm.protocol.records import Assignment, Health, Progress, StateOrigin

__all__ = ["ProgressBuilder", "ProgressPublisher", "recordable_loss"]

logger = logging.getLogger(__name__)


class ProgressBuilder:
    """This peer's Progress records, with what they carry across steps and plans (module docstring)."""

    def __init__(self, peer_id: str) -> None:
        self.peer_id = peer_id
        self.origin: tuple[StateOrigin, HandoffReport] | None = None
        """Where the current stage's state came from, and what moved."""
        self._recent_losses: collections.deque[tuple[int, float]] = collections.deque(maxlen=MAX_RECENT_LOSSES)
        """(step, loss) of the last consecutive steps this peer committed (last stage only)."""
        self._held_out: tuple[int, float] | None = None
        """(step, held-out loss) of the newest evaluation (last stage only)."""
        self._published: tuple[int, int] = (-1, -1)
        """(assignment version, step) of the last step record made."""

    def of_step(self, assignment: Assignment, report: StepReport, worker: StageWorker) -> Progress | None:
        """The record of a committed step; None when that step's record was made already (a step is published
        once)."""
        if (assignment.version, report.step) <= self._published:
            return None
        self._published = (assignment.version, report.step)
        published = recordable_loss(report.loss, report.step)
        self._remember_loss(report.step, published)
        self._remember_held_out(report)
        return Progress(
            peer_id=self.peer_id, assignment_version=assignment.version, step=report.step, loss=published,
            recent_losses=[loss for _, loss in self._recent_losses],
            **self._held_out_fields(), tokens_per_s=report.tokens_per_s, compute_s=report.compute_s,
            wait_s=report.wait_s, window_s=report.window_s, round_trip_s=report.round_trip_s,
            retries=report.retries, resyncs=report.resyncs, **self._origin_fields(),
            aborted=worker.board.aborted(report.step), updated_at=get_dht_time())

    def of_trouble(self, assignment: Assignment, step: int, health: Health, error: StageError,
                   worker: StageWorker | None = None) -> Progress:
        """The record that tells the coordinator at once that this peer cannot train `step`, why, which peers of the
        plan it could not reach, so that it can re-plan before their records expire, and the signed failure votes of
        the last attempts the plan aborted (every record carries them), so that it can leave out whoever caused
        them."""
        return Progress(
            peer_id=self.peer_id, assignment_version=assignment.version, step=step, loss=None,
            tokens_per_s=0.0, compute_s=0.0, wait_s=0.0, retries=worker.retries if worker else 0,
            resyncs=worker.resyncs if worker else 0, health=health, reason=str(error)[:256],
            unreachable=[p for p in dict.fromkeys(error.peers) if p in assignment.roles][:MAX_UNREACHABLE_PER_RECORD],
            aborted=worker.board.aborted(step) if worker else [],
            updated_at=get_dht_time(), **(self._origin_fields() if worker else {}))  # with a worker, it holds state

    def _remember_loss(self, step: int, loss: float | None) -> None:
        """Keeps the losses of the last consecutive steps for the Progress record; a jump back (a rollback, a
        resume) or a gap starts the list again."""
        if loss is None:
            return
        if self._recent_losses and self._recent_losses[-1][0] != step - 1:
            self._recent_losses.clear()
        self._recent_losses.append((step, loss))

    def _remember_held_out(self, report: StepReport) -> None:
        """Keeps the newest held-out loss for every Progress record until the next is measured (or a rollback or
        resume trains its step again). A figure a record cannot hold (non-finite, or beyond MAX_LOSS: activations a
        neighbour sent can make it so) is logged, not kept."""
        if self._held_out is not None and report.step <= self._held_out[0]:
            self._held_out = None
        loss = report.held_out_loss
        if loss is not None and not _fits_record(loss):
            logger.warning(f"Held-out loss {loss} after step {report.step} is not a loss a record can hold; "
                           f"not published")
        elif loss is not None:
            self._held_out = (report.step, loss)

    def _held_out_fields(self) -> dict:
        if self._held_out is None:
            return {}
        return {"held_out_step": self._held_out[0], "held_out_loss": self._held_out[1]}

    def _origin_fields(self) -> dict:
        if self.origin is None:
            return {}
        origin, report = self.origin
        return {"state_origin": origin, "handoff_bytes": report.bytes, "handoff_s": report.seconds}


def _fits_record(loss: float) -> bool:
    return 0.0 <= loss <= MAX_LOSS  # NaN fails both comparisons


def recordable_loss(loss: float | None, step: int) -> float | None:
    """A training loss as a Progress record holds it: a non-finite one, or one beyond MAX_LOSS (a diverged or
    corrupted model), as MAX_LOSS, the worst a record holds, so that the coordinator's loss watch sees the spike it
    is (coordinator/loss_watch.py) rather than this peer failing to publish at all."""
    if loss is None or _fits_record(loss):
        return loss
    logger.error(f"Loss {loss} at step {step}: the model diverged or its state is corrupted; reported as {MAX_LOSS:g}")
    return MAX_LOSS


class ProgressPublisher:
    """Publishes the newest Progress record in the background, so a slow DHT store never delays a step;
    records that a newer one overtakes while a store is in flight are dropped."""

    def __init__(self, node: SwarmNode, *, ttl_s: float) -> None:
        self.node, self.ttl_s = node, ttl_s
        self._latest: Progress | None = None
        self._task: asyncio.Task | None = None

    def submit(self, record: Progress) -> None:
        self._latest = record
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._drain())

    async def _drain(self) -> None:
        while (record := self._latest) is not None:
            self._latest = None
            try:
                stored = await self.node.records.publish(record, ttl_s=self.ttl_s)
            except Exception as e:  # the DHT is shutting down or unreachable: progress is best effort
                logger.debug(f"Could not publish progress: {e!r}", exc_info=True)
                continue
            if not stored:
                logger.debug(f"No DHT node took the progress record of step {record.step}")

    async def close(self) -> None:
        if self._task is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._task, timeout=5)
