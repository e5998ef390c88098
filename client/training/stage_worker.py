"""One stage of one pipeline, trained in lock-step with the rest of the swarm.

A step runs the assignment's M micro-batches through the stage in its pipeline schedule (GPipe or 1F1B,
client/training/pipeline_schedule.py), then the stage group's all-reduce of the gradients (and, with tied
embeddings, the sum of the first and last stages' copies: client/training/tied_embeddings.py), then the plan-wide
commit vote, then the optimizer step. The
all-reduce starts as soon as the backward ends, while the neighbours may still be acknowledging the last frames:
a send that then fails cancels it, and the attempt fails (waiting for the answers would add a round trip to the
step).

Steps are all-or-nothing (client/training/step_commit.py has the argument): an attempt of a step whose frames,
neighbours or all-reduce failed on any peer of the plan is aborted by every peer (gradients dropped, no optimizer
step) and retried as attempt + 1 with the same data, up to ``StageConfig.max_attempts`` attempts per
``run_step`` call. Frames and group ids carry (step, attempt). A failure vote from any peer cancels the attempt
at once everywhere. After a worker's first step, every ``check_every`` steps and after a step that needed a retry,
the replicas of each stage compare state hashes and a differing replica is resynchronised
(client/training/replica_sync.py). The passes themselves, with their frames and the data each stage draws, are
client/training/stage_passes.py's; a step equals ``reference_step`` on the same batch.

A single-stage plan runs ahead of its vote. Its passes need no frames, so once a peer has voted success it applies
the step at once and computes the next step's passes while the vote is out (one latency of the plan's farthest
pair, which would otherwise sit on every step). A copy of the state taken before that apply puts the step back if
the plan aborts it or its outcome stays unknown; the passes computed ahead are then dropped, and the next step's
attempt 0 uses them only if no one has touched the weights since (a replica check, which may replace them, never
follows a step that ran ahead). The weights, data and arithmetic are those of the step run in turn, so the result
is bit for bit the same (tests/test_run_ahead.py; client/training/run_ahead.py keeps the passes computed ahead).

When the plan asks for a held-out loss (``Assignment.eval_every``), the pipeline runs the held-out micro-batches
forward only through its stages once the step is committed, the activations travelling as frames of kind
`held-out` under the step's key; the last stage reports their mean loss (client/peer/held_out.py weighs the
pipelines' reports). A failed evaluation loses that figure only.
"""
import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Literal

import torch

from hetswarm.client.training.errors import StageError, StepAborted
from hetswarm.client.training.group_allreduce import StageGroup
from hetswarm.client.training.replica_sync import ReplicaSync
from hetswarm.client.training.run_ahead import Ahead, RunAhead
from hetswarm.client.training.stage_passes import StagePasses
from hetswarm.client.training.stage_state import StageState
from hetswarm.client.training.step_clock import mark, start_clock, waiting
from hetswarm.client.training.step_commit import CommitBoard, vote_for
from hetswarm.client.training.tied_embeddings import TiedMatrix
from hetswarm.protocol.errors import ConfigError
from hetswarm.protocol.keys import AppliedStep, ReadyStep
from hetswarm.protocol.model_config import ModelConfig

__all__ = ["StageConfig", "StageWorker", "StepReport"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True, slots=True)
class StageConfig:
    """How a stage trains and how long it waits for its peers; every peer of a swarm must use the same."""

    lr: float = 1e-3
    weight_decay: float = 0.1
    frame_timeout_s: float = 60.0
    """Deadline for a neighbour's frame, counted from when the worker starts waiting for it."""
    sender_timeout_s: float = 30.0
    """How late a group member may start its all-reduce before it is left out (and the round is partial)."""
    reducer_timeout_s: float = 60.0
    start_timeout_s: float = 60.0
    """How long start_stage waits for the neighbours and the group to come up."""
    commit_timeout_s: float = 60.0
    """How long a peer may wait to learn every member's commit vote before the step's outcome counts as unknown."""
    blame_grace_s: float = 0.25
    """How long a peer whose attempt failed waits for news of a failure elsewhere before it casts a failure vote
    of its own (`step_commit.vote_for`): about the time a vote takes to reach every member."""
    max_attempts: int = 3
    """Attempts of one step per ``run_step`` call before it raises StepAborted."""
    check_every: int = 50
    """Replicas compare (and repair) their state after every this many steps, and after any retried step."""
    max_delta_bytes: int = 2 * 1024**3
    """Memory the activation copies of AQ-SGD may take at each end of a link (client/training/activation_deltas.py)."""

    def __post_init__(self) -> None:
        if self.lr <= 0 or self.weight_decay < 0:
            raise ConfigError(f"need lr > 0 and weight_decay >= 0, got {self.lr} and {self.weight_decay}")
        if not 0 < self.sender_timeout_s < self.reducer_timeout_s:
            raise ConfigError(f"need 0 < sender_timeout_s < reducer_timeout_s, got {self.sender_timeout_s} "
                             f"and {self.reducer_timeout_s}")
        if self.frame_timeout_s <= 0 or self.start_timeout_s <= 0 or self.commit_timeout_s <= 0:
            raise ConfigError(f"timeouts must be positive, got {self.frame_timeout_s}, {self.start_timeout_s} and "
                              f"{self.commit_timeout_s}")
        if self.blame_grace_s < 0:
            raise ConfigError(f"need blame_grace_s >= 0, got {self.blame_grace_s}")
        if self.max_attempts < 1 or self.check_every < 1:
            raise ConfigError(f"need max_attempts >= 1 and check_every >= 1, got {self.max_attempts} and "
                              f"{self.check_every}")

    def build_optimizer(self, params: Iterable[torch.nn.Parameter]) -> torch.optim.AdamW:
        """AdamW with GPT-2-style betas (nanoGPT, train.py); the single-process reference builds the same."""
        return torch.optim.AdamW(params, lr=self.lr, weight_decay=self.weight_decay, betas=(0.9, 0.95))

    def set_step_lr(self, optimizer: torch.optim.Optimizer, model: ModelConfig, step: int) -> None:
        """Gives `optimizer` the learning rate of optimizer step `step` under the plan's warm-up
        (ModelConfig.lr_factor); call before each step, as the single-process reference does too."""
        for group in optimizer.param_groups:
            group["lr"] = self.lr * model.lr_factor(step)


@dataclass(frozen=True, kw_only=True, slots=True)
class StepReport:
    """One finished step of this peer, for its Progress record."""

    step: AppliedStep
    loss: float | None
    """This pipeline's mean loss over its micro-batches; only the last stage knows it."""
    compute_s: float
    wait_s: float
    """Time spent waiting for neighbours' frames and for the group all-reduce."""
    wall_s: float
    """From the step's first pass (computed ahead, while the plan voted on the step before, on a single stage) to
    its commit."""
    tokens: int
    """Tokens this pipeline trained on in the step."""
    attempt: int = 0
    """The attempt that was committed (0 when the first try succeeded)."""
    retries: int = 0
    """Aborted attempts of this worker so far, all steps together."""
    resyncs: int = 0
    """Times this replica's state was replaced by its stage group's, so far."""
    computed_ahead: bool = False
    """Its passes were computed while the plan voted on the step before (module docstring)."""
    rollbacks: int = 0
    """Steps this worker applied ahead of the plan's decision and put back when the plan aborted them, so far."""
    held_out_loss: float | None = None
    """The pipeline's mean loss on the held-out set after this step, when the plan evaluated it (last stage only)."""
    window_s: float | None = None
    """How long this stage held its upstream neighbour's micro-batches, summed (None on the first stage): what the
    upstream neighbour's round trip contains besides this stage's compute (coordinator/claims.py)."""
    round_trip_s: float | None = None
    """From each activation sent downstream to its gradient's return, summed (None on the last stage): a bound on
    the downstream neighbour's compute that this peer, not that neighbour, measured (coordinator/claims.py)."""

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s if self.wall_s > 0 else 0.0


class StageWorker:
    """Holds a stage's module and optimizer and runs its steps; ``start_stage`` builds one."""

    def __init__(
        self, passes: StagePasses, *, group: StageGroup, board: CommitBoard, replicas: ReplicaSync,
        config: StageConfig, optimizer: torch.optim.Optimizer, eval_every: int = 0, tied: TiedMatrix | None = None,
    ) -> None:
        self.passes, self.module, self.streams = passes, passes.module, passes.streams
        self.group, self.board, self.replicas, self.tied = group, board, replicas, tied
        """`tied`: this stage's copy of a tied embedding matrix, summed with the other stage's every step (or None)."""
        self.config, self.optimizer = config, optimizer
        self.eval_every = eval_every
        """The pipeline measures its held-out loss after every step s with (s + 1) % eval_every == 0; 0: never."""
        self.next_step: ReadyStep | None = None
        self.retries = self.resyncs = self.rollbacks = 0
        self.on_failure: Callable[[StageError], None] | None = None
        """Called with each failure of an attempt here, before the plan's vote: a driver reports it at once."""
        self._attempt: tuple[int, int] | None = None  # (step, next attempt) of the step not yet committed
        self._unreachable: set[str] = set()
        """Peers this step's failed attempts found unreachable: its StepAborted names them too, so that the report
        it makes does not hide the earlier ones."""
        self._ahead = RunAhead(self.module, self._passes_ahead)
        """The next step's passes, running while the plan votes on this one (a single stage)."""

    async def close(self) -> None:
        """Stops serving this stage's handlers (a new assignment builds a new worker); each part on its own, so that
        one never attached (a start that failed half-way) does not keep the others registered."""
        await self._ahead.drop()
        for part in filter(None, (self.streams, self.group, self.board, self.replicas, self.tied)):
            with contextlib.suppress(Exception):
                await part.detach()

    async def run_step(self, step: ReadyStep, *, ahead: bool = True) -> StepReport:
        """Trains one step, retrying it under new attempt numbers until the whole plan commits it; steps must come
        in increasing order. Calling again with a step that raised StepAborted goes on with its next attempt.
        ``ahead=False``: no step follows, so none is computed ahead (module docstring).

        Raises:
            StepAborted: ``max_attempts`` attempts were aborted by the plan; no peer applied the step.
            CommitUnknown: this peer could not learn the plan's decision; it did not apply the step.
        """
        if self.next_step is not None and step < self.next_step:
            raise ConfigError(f"steps only go forward: step {step} was asked for after step {self.next_step - 1}")
        if self._attempt is None or self._attempt[0] != step:
            self._attempt, self._unreachable = (step, 0), set()
        clock = start_clock()
        wall_clock = time.time()
        self.board.prune(step)
        computed_ahead = False
        for _ in range(self.config.max_attempts):
            attempt = self._attempt[1]
            precomputed = await self._ahead.take(step, attempt)
            if precomputed is not None:
                computed_ahead = True
                clock.add(precomputed.clock)
            clock.new_attempt()
            loss = await self._try(step, attempt, precomputed, ahead=ahead)
            self._attempt = (step, attempt + 1)
            if loss is not False:
                break
            self.retries += 1
        else:
            raise StepAborted(f"step {step}: {self.config.max_attempts} attempts in a row were aborted; "
                              f"the last was attempt {self._attempt[1] - 1}", peers=sorted(self._unreachable))
        checked = self._checks_replicas_after(step, attempt)
        self.next_step = step + 1
        if checked and await waiting(self.replicas.check(step)):
            self.resyncs += 1
        clock.log_timeline(f"Step {step}", wall_clock)
        report = StepReport(step=step, loss=loss, compute_s=clock.compute_s, wait_s=clock.wait_s,
                            wall_s=time.perf_counter() - clock.started, tokens=self.passes.tokens_per_step,
                            attempt=attempt, retries=self.retries, resyncs=self.resyncs,
                            computed_ahead=computed_ahead, rollbacks=self.rollbacks,
                            window_s=None if self.module.is_first else clock.window_s,
                            round_trip_s=None if self.module.is_last else clock.round_trip_s)
        if self.eval_every and (step + 1) % self.eval_every == 0:
            report = replace(report, held_out_loss=await self.passes.held_out_loss(step, attempt))
        return report

    def _checks_replicas_after(self, step: int, attempt: int) -> bool:
        """Whether the replicas compare states once `step` commits at `attempt`: on a new plan's first step (the
        replicas may come from different histories), after a retried step, and every `check_every` steps."""
        return self.next_step is None or attempt > 0 or (step + 1) % self.config.check_every == 0

    async def _try(self, step: int, attempt: int, precomputed: Ahead | None, *, ahead: bool
                   ) -> float | None | Literal[False]:
        """One attempt: compute (or take the passes `precomputed`), vote, and apply when the plan commits; with
        `ahead`, a single stage applies on its own success and computes the next step while the vote is out. Returns
        the loss (None off the last stage) when committed, False when the plan aborted the attempt."""
        self.streams.advance_to(step, attempt)
        self.optimizer.zero_grad(set_to_none=True)
        key = (step, attempt)
        capture = None  # a copy of the state before the step, to put it back; taken while the passes only read it
        if ahead and self.passes.role.d_pp == 1 and not self._checks_replicas_after(step, attempt):
            capture = asyncio.ensure_future(asyncio.to_thread(StageState.capture, self.module, self.optimizer, step))
        body = asyncio.create_task(self._compute_attempt(step, attempt, precomputed))
        failed_elsewhere = asyncio.create_task(self.board.wait_failed(key))
        try:
            await asyncio.wait({body, failed_elsewhere}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            failed_elsewhere.cancel()
            if not body.done():
                body.cancel()
            await asyncio.gather(body, failed_elsewhere, return_exceptions=True)
        error = None if body.cancelled() else body.exception()
        if error is not None and not isinstance(error, StageError):
            await self.board.decide(key, False, timeout_s=self.config.commit_timeout_s)
            raise error
        succeeded = not body.cancelled() and error is None
        if not succeeded:
            logger.warning(f"Step {step}, attempt {attempt} failed here: "
                           f"{error if error is not None else 'another peer of the plan failed it'}")
            if error is not None:
                self._unreachable.update(error.peers)
            if error is not None and self.on_failure is not None:
                self.on_failure(error)
        vote, cause = await vote_for(self.board, key, succeeded, error, blame_grace_s=self.config.blame_grace_s)
        loss, grads = body.result() if succeeded else (None, [])
        before = None
        if capture is not None and succeeded:
            before = await self._apply_ahead(step, capture, grads)
        elif capture is not None:
            capture.cancel()
        try:
            committed = await waiting(self.board.decide(key, vote, cause=cause,
                                                              timeout_s=self.config.commit_timeout_s))
        except BaseException:  # the outcome is unknown (or we are cancelled): this peer must not have applied it
            if before is not None:
                await self._roll_back(before)
            raise
        mark("voted")
        if not committed:
            if succeeded:
                logger.warning(f"Step {step}, attempt {attempt} aborted: another peer of the plan failed it")
            if before is not None:
                await self._roll_back(before)
            self.optimizer.zero_grad(set_to_none=True)
            return False
        self.streams.commit(step, attempt)
        if before is None:
            await self._apply(step, grads)
        return loss

    async def _apply(self, step: int, grads: list[torch.Tensor]) -> None:
        for param, grad in zip(self.module.parameters(), grads):
            param.grad = grad
        self.config.set_step_lr(self.optimizer, self.passes.role.model, step)
        await self.passes.computing(self.optimizer.step)
        mark("applied")

    async def _apply_ahead(self, step: int, capture: asyncio.Future[StageState], grads: list[torch.Tensor]
                           ) -> StageState | None:
        """Applies the step before the plan's decision and starts computing the next one; returns the state that puts
        it back, or None (nothing applied: the step waits for the decision) when that state could not be copied."""
        try:
            before = await capture
        except Exception as e:
            logger.warning(f"Could not copy the state before step {step}, so it is not applied ahead: {e!r}")
            return None
        await self._apply(step, grads)
        grads.clear()  # applied: let them go before the next step's passes make new ones
        self._ahead.start(step + 1)
        return before

    async def _roll_back(self, before: StageState) -> None:
        """Puts back the state of before a step applied ahead of the plan's decision, and drops what ran ahead."""
        await self._ahead.drop()
        before.apply(self.module, self.optimizer)
        self.rollbacks += 1
        logger.info(f"Step {before.step} was applied ahead of the plan's decision; put back")

    async def _passes_ahead(self, step: int) -> tuple[float | None, list[torch.Tensor]]:
        """Attempt 0's passes of `step`, on the weights as they are now (a single stage: no frames)."""
        self.optimizer.zero_grad(set_to_none=True)
        async with asyncio.TaskGroup() as sends:  # none: a single stage has no neighbours
            loss = await self.passes.run(step, 0, sends)
        grads = self.passes.grads()
        self.optimizer.zero_grad(set_to_none=True)
        return loss, grads

    async def _compute_attempt(self, step: int, attempt: int, precomputed: Ahead | None
                               ) -> tuple[float | None, list[torch.Tensor]]:
        """Forward, backward (unless `precomputed`) and the group all-reduce of one attempt; returns the loss and
        the averaged grads."""
        try:
            async with asyncio.TaskGroup() as sends:  # a failed send cancels the rest, the all-reduce included
                if precomputed is None:
                    loss = await self.passes.run(step, attempt, sends)
                    mark("backward")
                    grads = self.passes.grads()
                else:
                    loss, grads = precomputed.loss, precomputed.grads
                await waiting(self.group.average(grads, step=step, attempt=attempt))
                if self.tied is not None:
                    await waiting(self.tied.sum(grads, step=step, attempt=attempt))
                mark("all-reduced")
        except* StageError as failures:
            raise failures.exceptions[0] from None
        mark("sent")
        return loss, grads
