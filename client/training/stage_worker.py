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
(client/training/replica_sync.py). The first stage draws its inputs
from the TokenSource, the last stage draws the same micro-batches for their targets (the data is a pure function
of step, pipeline and micro-batch, so the two ends agree without talking); the stages between only relay.
Gradients follow the loss convention of hetswarm.client.training.reference: the last stage backpropagates CE / M, the
group all-reduce averages, so one step here equals ``reference_step`` on the same batch.

A single-stage plan runs ahead of its vote. Its passes need no frames, so once a peer has voted success it applies
the step at once and computes the next step's passes while the vote is out (one latency of the plan's farthest
pair, which would otherwise sit on every step). A copy of the state taken before that apply puts the step back if
the plan aborts it or its outcome stays unknown; the passes computed ahead are then dropped, and the next step's
attempt 0 uses them only if no one has touched the weights since (a replica check, which may replace them, never
follows a step that ran ahead). The weights, data and arithmetic are those of the step run in turn, so the result
is bit for bit the same (tests/test_run_ahead.py).

When the plan asks for a held-out loss (``Assignment.eval_every``), the pipeline runs the held-out micro-batches
forward only through its stages once the step is committed, the activations travelling as frames of kind
`held-out` under the step's key; the last stage reports their mean loss (client/peer/held_out.py weighs the
pipelines' reports). A failed evaluation loses that figure only.

Compute runs in a worker thread, so this peer's event loop keeps taking frames and all-reduce parts while it
computes. On CUDA the forward pass runs under bf16 autocast with fp32 weights; every tensor that leaves the
peer is moved to the CPU first.
"""
import asyncio
import contextlib
import contextvars
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

import torch
from hivemind.p2p import P2P, PeerID
from hivemind.utils.crypto import RSAPrivateKey

from hetswarm.client.training.activation_deltas import buffer_bytes
from hetswarm.client.training.data import TokenSource, sequences_per_micro_batch
from hetswarm.client.training.errors import StageError, StepAborted
from hetswarm.client.training.group_allreduce import StageGroup
from hetswarm.client.training.model import StageModule, build_stage
from hetswarm.client.training.neighbour_streams import NeighbourStreams, StreamPlan
from hetswarm.client.training.pipeline_schedule import pass_order
from hetswarm.client.training.reference import micro_batch_loss
from hetswarm.client.training.replica_sync import ReplicaSync
from hetswarm.client.training.stage_state import StageState
from hetswarm.client.training.step_commit import CommitBoard, StepKey
from hetswarm.client.training.tied_embeddings import TiedMatrix
from hetswarm.protocol.errors import ConfigError
from hetswarm.protocol.identity import peer_id_of
from hetswarm.protocol.keys import (
    allreduce_namespace,
    commit_namespace,
    replica_namespace,
    round_tag,
    stage_namespace,
)
from hetswarm.protocol.model_config import ModelConfig, PipelineSchedule
from hetswarm.protocol.records import Assignment

__all__ = ["StageConfig", "StageWorker", "StepReport", "check_data", "in_thread", "start_stage"]

logger = logging.getLogger(__name__)


async def in_thread(fn: Callable, *args):
    """``fn(*args)`` in a worker thread; a cancelled caller returns only once the thread is over, however often it is
    cancelled meanwhile. An aborted attempt is cancelled twice (by the plan's vote, then by its TaskGroup when a send
    of it fails), and a backward thread still running then would write its .grad into the next attempt's (seen as a
    retried step that left the fault-free trajectory, tests/test_step_faults.py)."""
    running = asyncio.ensure_future(asyncio.to_thread(fn, *args))
    try:
        return await asyncio.shield(running)
    except asyncio.CancelledError:
        while not running.done():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait({running})
        raise


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
    of its own (`StageWorker._vote`): about the time a vote takes to reach every member."""
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


@dataclass(frozen=True, kw_only=True, slots=True)
class StepReport:
    """One finished step of this peer, for its Progress record."""

    step: int
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


@dataclass(slots=True)
class _Clock:
    """Where one step's time went: compute, waiting, and (event, perf_counter) marks for the debug log."""

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


_CLOCK: contextvars.ContextVar[_Clock] = contextvars.ContextVar("hetswarm_step_clock")
"""The clock of the step the running task works on: passes computed ahead run in a task of their own beside the
step before, and must not charge their time to it."""


@dataclass(frozen=True, slots=True)
class _Ahead:
    """A step's passes, computed while the plan voted on the step before."""

    step: int
    loss: float | None
    grads: list[torch.Tensor]
    weights: tuple[int, ...]
    """The parameters' versions (torch counts in-place changes) when the passes ran: they count only as long as the
    weights are still those."""
    clock: _Clock


class StageWorker:
    """Holds a stage's module and optimizer and runs its steps; ``start_stage`` builds one."""

    def __init__(
        self, module: StageModule, *, streams: NeighbourStreams, group: StageGroup, board: CommitBoard,
        replicas: ReplicaSync, data: TokenSource, model_config: ModelConfig, pipeline: int, n_pipelines: int,
        device: torch.device, config: StageConfig, optimizer: torch.optim.Optimizer, stage: int, d_pp: int,
        schedule: PipelineSchedule = "gpipe", emulated_tflops: float | None = None, eval_every: int = 0,
        tied: TiedMatrix | None = None,
    ) -> None:
        self.module, self.streams, self.group, self.data = module, streams, group, data
        self.tied = tied
        """This stage's copy of a tied embedding matrix, summed with the other stage's every step; None: none."""
        self.board, self.replicas = board, replicas
        self.model_config, self.pipeline, self.n_pipelines = model_config, pipeline, n_pipelines
        self.device, self.config = device, config
        self.emulated_tflops = emulated_tflops
        """Every computation here takes as long as on a device of this speed (`hetswarm join --emulate-tflops`)."""
        self.eval_every = eval_every
        """The pipeline measures its held-out loss after every step s with (s + 1) % eval_every == 0; 0: never."""
        self.micro_batches, self.schedule = model_config.micro_batches, schedule
        self.stage, self.d_pp = stage, d_pp
        self.micro_batch_size = sequences_per_micro_batch(model_config, n_pipelines)
        a, b = module.layers
        self.forward_flops = model_config.flops_per_token_of(b - a, first=module.is_first, last=module.is_last) / 3 \
            * self.micro_batch_size * model_config.seq_len
        """One micro-batch's forward pass (a third of forward+backward, PaLM Appendix B); the backward is twice it,
        plus a forward again when the stage recomputes its activations."""
        self.optimizer = optimizer
        self.next_step: int | None = None
        self.retries = self.resyncs = self.rollbacks = 0
        self.on_failure: Callable[[StageError], None] | None = None
        """Called with each failure of an attempt here, before the plan's vote: a driver reports it at once."""
        self._attempt: tuple[int, int] | None = None  # (step, next attempt) of the step not yet committed
        self._unreachable: set[str] = set()
        """Peers this step's failed attempts found unreachable: its StepAborted names them too, so that the report
        it makes does not hide the earlier ones."""
        self._ahead: asyncio.Task[_Ahead] | None = None
        """The next step's passes, running while the plan votes on this one."""

    async def close(self) -> None:
        """Stops serving this stage's handlers (a new assignment builds a new worker); each part on its own, so that
        one never attached (a start that failed half-way) does not keep the others registered."""
        await self._drop_ahead()
        for part in filter(None, (self.streams, self.group, self.board, self.replicas, self.tied)):
            with contextlib.suppress(Exception):
                await part.detach()

    async def run_step(self, step: int, *, ahead: bool = True) -> StepReport:
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
        clock = _Clock()
        _CLOCK.set(clock)
        wall_clock = time.time()
        self.board.prune(step)
        computed_ahead = False
        for _ in range(self.config.max_attempts):
            attempt = self._attempt[1]
            precomputed = await self._take_ahead(step, attempt)
            if precomputed is not None:
                computed_ahead = True
                clock.started = min(clock.started, precomputed.clock.started)
                clock.compute_s += precomputed.clock.compute_s
                clock.timeline += [(f"ahead {event}", at) for event, at in precomputed.clock.timeline]
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
        if checked and await self._waiting(self.replicas.check(step)):
            self.resyncs += 1
        if logger.isEnabledFor(logging.DEBUG):  # built only when shown: this runs every step
            logger.debug(f"Step {step} from {wall_clock:.3f} (wall clock): " + ", ".join(
                f"{event} {at - clock.started:+.3f}" for event, at in sorted(clock.timeline, key=lambda e: e[1])))
        report = StepReport(step=step, loss=loss, compute_s=clock.compute_s, wait_s=clock.wait_s,
                            wall_s=time.perf_counter() - clock.started,
                            tokens=self.micro_batches * self.micro_batch_size * self.model_config.seq_len,
                            attempt=attempt, retries=self.retries, resyncs=self.resyncs,
                            computed_ahead=computed_ahead, rollbacks=self.rollbacks,
                            window_s=None if self.module.is_first else clock.window_s,
                            round_trip_s=None if self.module.is_last else clock.round_trip_s)
        if self.eval_every and (step + 1) % self.eval_every == 0:
            report = replace(report, held_out_loss=await self._held_out_loss(step, attempt))
        return report

    def _checks_replicas_after(self, step: int, attempt: int) -> bool:
        """Whether the replicas compare states once `step` commits at `attempt`: on a new plan's first step (the
        replicas may come from different histories), after a retried step, and every `check_every` steps."""
        return self.next_step is None or attempt > 0 or (step + 1) % self.config.check_every == 0

    async def _try(self, step: int, attempt: int, precomputed: _Ahead | None, *, ahead: bool
                   ) -> float | None | Literal[False]:
        """One attempt: compute (or take the passes `precomputed`), vote, and apply when the plan commits; with
        `ahead`, a single stage applies on its own success and computes the next step while the vote is out. Returns
        the loss (None off the last stage) when committed, False when the plan aborted the attempt."""
        self.streams.advance_to(step, attempt)
        self.optimizer.zero_grad(set_to_none=True)
        key = (step, attempt)
        capture = None  # a copy of the state before the step, to put it back; taken while the passes only read it
        if ahead and self.d_pp == 1 and not self._checks_replicas_after(step, attempt):
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
        vote, cause = await self._vote(key, succeeded, error)
        loss, grads = body.result() if succeeded else (None, [])
        before = None
        if capture is not None and succeeded:
            before = await self._apply_ahead(step, capture, grads)
        elif capture is not None:
            capture.cancel()
        try:
            committed = await self._waiting(self.board.decide(key, vote, cause=cause,
                                                              timeout_s=self.config.commit_timeout_s))
        except BaseException:  # the outcome is unknown (or we are cancelled): this peer must not have applied it
            if before is not None:
                await self._roll_back(before)
            raise
        self._mark("voted")
        if not committed:
            if succeeded:
                logger.warning(f"Step {step}, attempt {attempt} aborted: another peer of the plan failed it")
            if before is not None:
                await self._roll_back(before)
            self.optimizer.zero_grad(set_to_none=True)
            return False
        self.streams.commit(step, attempt)
        if before is None:
            await self._apply(grads)
        return loss

    async def _vote(self, key: StepKey, succeeded: bool, error: StageError | None) -> tuple[bool | None, str | None]:
        """This peer's vote on an attempt: success; a failure naming the member that caused it; or none at all
        (abstain) when it stopped on another member's failure, or learns of one within `blame_grace_s` of its own
        while the member it blames has not voted success (cancelled streams and broken rounds follow an abort): a
        vote would implicate peers that did nothing wrong (coordinator/failure_votes.py). A member that voted
        success and failed us anyway is named, whatever else failed: that is how two partners of a hostile reducer
        corroborate each other."""
        if succeeded:
            return True, None
        if error is None:
            return None, None
        if await self.board.failed_within(key, self.config.blame_grace_s) and not self.board.succeeded(key, error.cause):
            return None, None
        return False, error.cause

    async def _apply(self, grads: list[torch.Tensor]) -> None:
        for param, grad in zip(self.module.parameters(), grads):
            param.grad = grad
        await self._computing(self.optimizer.step)
        self._mark("applied")

    async def _apply_ahead(self, step: int, capture: asyncio.Future[StageState], grads: list[torch.Tensor]
                           ) -> StageState | None:
        """Applies the step before the plan's decision and starts computing the next one; returns the state that puts
        it back, or None (nothing applied: the step waits for the decision) when that state could not be copied."""
        try:
            before = await capture
        except Exception as e:
            logger.warning(f"Could not copy the state before step {step}, so it is not applied ahead: {e!r}")
            return None
        await self._apply(grads)
        grads.clear()  # applied: let them go before the next step's passes make new ones
        self._ahead = asyncio.create_task(self._run_ahead(step + 1))
        return before

    async def _roll_back(self, before: StageState) -> None:
        """Puts back the state of before a step applied ahead of the plan's decision, and drops what ran ahead."""
        await self._drop_ahead()
        before.apply(self.module, self.optimizer)
        self.rollbacks += 1
        logger.info(f"Step {before.step} was applied ahead of the plan's decision; put back")

    async def _run_ahead(self, step: int) -> _Ahead:
        """Attempt 0's passes of `step`, on the weights as they are now (a single stage: no frames)."""
        clock = _Clock()
        _CLOCK.set(clock)  # this task's own
        weights = tuple(param._version for param in self.module.parameters())
        self.optimizer.zero_grad(set_to_none=True)
        async with asyncio.TaskGroup() as sends:  # none: a single stage has no neighbours
            loss = await self._passes(step, 0, sends)
        grads = self._grads()
        self.optimizer.zero_grad(set_to_none=True)
        return _Ahead(step=step, loss=loss, grads=grads, weights=weights, clock=clock)

    async def _take_ahead(self, step: int, attempt: int) -> _Ahead | None:
        """The passes computed ahead for this attempt, once they are done; None when there are none, or they are
        for another step or attempt, failed, or ran on weights that have changed since."""
        task, self._ahead = self._ahead, None
        if task is None:
            return None
        await asyncio.wait({task})
        if task.cancelled() or task.exception() is not None:
            logger.debug(f"Passes computed ahead for step {step} are lost: "
                         f"{'cancelled' if task.cancelled() else repr(task.exception())}")
            return None
        precomputed = task.result()
        weights = tuple(param._version for param in self.module.parameters())
        return precomputed if (precomputed.step, attempt, precomputed.weights) == (step, 0, weights) else None

    async def _drop_ahead(self) -> None:
        task, self._ahead = self._ahead, None
        if task is not None:
            task.cancel()
            await asyncio.wait({task})

    def _grads(self) -> list[torch.Tensor]:
        return [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.module.parameters()]

    async def _compute_attempt(self, step: int, attempt: int, precomputed: _Ahead | None
                               ) -> tuple[float | None, list[torch.Tensor]]:
        """Forward, backward (unless `precomputed`) and the group all-reduce of one attempt; returns the loss and
        the averaged grads."""
        try:
            async with asyncio.TaskGroup() as sends:  # a failed send cancels the rest, the all-reduce included
                if precomputed is None:
                    loss = await self._passes(step, attempt, sends)
                    self._mark("backward")
                    grads = self._grads()
                else:
                    loss, grads = precomputed.loss, precomputed.grads
                await self._waiting(self.group.average(grads, step=step, attempt=attempt))
                if self.tied is not None:
                    await self._waiting(self.tied.sum(grads, step=step, attempt=attempt))
                self._mark("all-reduced")
        except* StageError as failures:
            raise failures.exceptions[0] from None
        self._mark("sent")
        return loss, grads

    async def _passes(self, step: int, attempt: int, sends: asyncio.TaskGroup) -> float | None:
        """Every micro-batch's forward and backward in the plan's schedule; returns the pipeline's loss on the last
        stage (summed in micro-batch order, whatever the schedule), else None."""
        held, losses = {}, {}  # micro-batch → (output or loss, input) until its backward
        for kind, m in pass_order(self.schedule, stage=self.stage, d_pp=self.d_pp, micro_batches=self.micro_batches):
            if kind == "forward":
                held[m] = await self._forward(step, attempt, m, sends)
                continue
            output, x = held.pop(m)
            await self._backward(step, attempt, m, output, x, sends)
            if self.module.is_last:
                losses[m] = output.item()
        return sum(losses[m] for m in range(self.micro_batches)) if self.module.is_last else None

    async def _forward(self, step: int, attempt: int, m: int, sends: asyncio.TaskGroup,
                       kind: Literal["activations", "held-out"] = "activations") -> tuple[torch.Tensor, torch.Tensor]:
        """Micro-batch m's forward pass, its output sent on; returns what its backward needs: the output (the loss
        on the last stage) and the input. Of kind `held-out`: a micro-batch of the held-out set, without autograd."""
        training = kind == "activations"
        if training:
            tokens, targets = self.data.batch(step=self.model_config.data_step(step), pipeline=self.pipeline,
                                              n_pipelines=self.n_pipelines, micro_batch=m,
                                              micro_batch_size=self.micro_batch_size,
                                              seq_len=self.model_config.seq_len)  # (B, T), (B, T)
        else:
            tokens, targets = self.data.held_out_batch(micro_batch=m, micro_batch_size=self.micro_batch_size,
                                                       micro_batches=self.micro_batches,
                                                       seq_len=self.model_config.seq_len)  # (B, T), (B, T)
        if self.module.is_first:
            x = tokens.to(self.device)
        else:
            received = await self._waiting(self.streams.receive(kind, step=step, micro_batch=m, attempt=attempt))
            self._mark(f"a{m}")
            x = received.to(self.device, torch.float32)  # (B, T, C)
            if training:
                _CLOCK.get().arrived[m] = time.perf_counter()
                x = x.detach().requires_grad_()  # not the copy
        out = await self._computing(self._module_forward if training else self._forward_only, x, targets,
                                    flops=self.forward_flops)
        if not self.module.is_last:
            if training:
                _CLOCK.get().sent[m] = time.perf_counter()
            sends.create_task(self.streams.send(kind, out, step=step, micro_batch=m, attempt=attempt))
        return out, x

    async def _held_out_loss(self, step: int, attempt: int) -> float | None:
        """A forward-only pass of the held-out micro-batches through the pipeline, on the weights after `step`
        (committed at `attempt`); returns their mean loss on the last stage, None elsewhere. A neighbour that fails
        it costs this measurement only: training goes on, and the next evaluation is another chance."""
        _CLOCK.set(_Clock())  # its time is not the step's
        failure = None
        try:
            async with asyncio.TaskGroup() as sends:
                outputs = [(await self._forward(step, attempt, m, sends, "held-out"))[0]
                           for m in range(self.micro_batches)]
        except* Exception as failures:  # a neighbour's failure, or anything else: training state is untouched
            failure = failures.exceptions[0]
        if failure is not None:
            logger.warning(f"No held-out loss after step {step}: {failure!r}")
            return None
        return sum(out.item() for out in outputs) if self.module.is_last else None

    def _forward_only(self, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return self._module_forward(x, targets)

    def _module_forward(self, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.device.type == "cuda"):
            out = self.module(x)  # (B, T, C) or logits (B, T, V)
        if self.module.is_last:
            return micro_batch_loss(out, targets.to(self.device), micro_batches=self.micro_batches)
        return out

    async def _backward(self, step: int, attempt: int, m: int, output: torch.Tensor, x: torch.Tensor,
                        sends: asyncio.TaskGroup) -> None:
        """Micro-batch m's backward pass, the gradient of its input sent back."""
        clock = _CLOCK.get()
        if self.module.is_last:
            await self._computing(output.backward, flops=self._backward_flops)
        else:
            grad = await self._waiting(self.streams.receive("gradients", step=step, micro_batch=m, attempt=attempt))
            self._mark(f"g{m}")
            clock.round_trip_s += time.perf_counter() - clock.sent.pop(m)
            await self._computing(output.backward, grad.to(self.device, output.dtype), flops=self._backward_flops)
        if not self.module.is_first:
            clock.window_s += time.perf_counter() - clock.arrived.pop(m)
            sends.create_task(self.streams.send("gradients", x.grad, step=step, micro_batch=m, attempt=attempt))

    @property
    def _backward_flops(self) -> float:
        return self.forward_flops * (3 if self.module.recompute else 2)

    async def _computing(self, fn: Callable, *args, flops: float = 0.0):
        """Runs ``fn`` in a worker thread, counting its time as compute (the device synchronized on CUDA); when
        emulating a device, at least as long as its `flops` take there."""
        def timed():
            result = fn(*args)
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            return result

        started, clock = time.perf_counter(), _CLOCK.get()
        try:
            result = await in_thread(timed)
            if self.emulated_tflops is not None:  # as long as on the slower device this peer emulates
                await asyncio.sleep(max(0.0, flops / (self.emulated_tflops * 1e12) - (time.perf_counter() - started)))
            return result
        finally:
            clock.compute_s += time.perf_counter() - started

    def _mark(self, event: str) -> None:
        _CLOCK.get().timeline.append((event, time.perf_counter()))

    async def _waiting(self, awaitable):
        started, clock = time.perf_counter(), _CLOCK.get()
        try:
            return await awaitable
        finally:
            clock.wait_s += time.perf_counter() - started


def _eval_every(assignment: Assignment, data: TokenSource) -> int:
    """The plan's evaluation period, or 0 when the data has no usable held-out split (every peer's data is the
    plan's, so every stage of the pipeline decides alike)."""
    problem = data.held_out_problem(assignment.model_config().seq_len) if assignment.eval_every else None
    if problem is not None:
        logger.warning(f"Plan v{assignment.version} asks for a held-out loss every {assignment.eval_every} steps, "
                       f"but {problem}: none measured")
        return 0
    return assignment.eval_every


async def start_stage(
    assignment: Assignment, identity: RSAPrivateKey, *, p2p: P2P, swarm: str, device: torch.device | str,
    data: TokenSource, seed: int, config: StageConfig = StageConfig(), emulated_tflops: float | None = None,
    model_dir: Path | None = None,
) -> StageWorker:
    """Builds this peer's stage of the plan, serving its neighbour streams and its group, once all its peers answer.

    `identity` is this peer's key (``p2p``'s peer id is its): it signs the peer's commit votes. Every peer of the
    swarm must pass the same ``swarm``, ``data``, ``seed`` and ``config``: replicas start from identical weights and
    the two ends of a pipeline draw the same micro-batches. A model that starts from a Hugging Face folder's
    weights (ModelConfig.init_digest) takes them from ``model_dir``, this peer's copy.

    Raises:
        StageError: this peer has no role in the assignment, its peers did not come up in time, ``data`` is not
            the plan's, or ``model_dir`` is not the folder the plan's model starts from.
    """
    me = peer_id_of(identity.get_public_key())
    if me not in assignment.roles:
        raise StageError(f"{me} has no role in assignment version {assignment.version}")
    role, device = assignment.roles[me], torch.device(device)
    my_pipeline = assignment.pipelines[role.replica]  # its peers, in stage order
    model_config = assignment.model_config()  # checked where the assignment was accepted
    module = build_stage(model_config, role.stage, assignment.d_pp, seed=seed, device=device,
                         stage_layers=assignment.stage_layers,  # only its layers, cut as the plan says
                         recompute=assignment.recompute)
    check_data(model_config, data)
    if model_config.init_digest is not None:
        await _load_initial_weights(module, model_dir)

    neighbours = [my_pipeline[s] if 0 <= s < assignment.d_pp else None for s in (role.stage - 1, role.stage + 1)]
    previous, following = (PeerID.from_base58(peer) if peer else None for peer in neighbours)
    wire = assignment.wire_format()
    plan = StreamPlan(assignment_version=assignment.version, pipeline=role.replica,
                    micro_batches=assignment.micro_batches, wire=wire, previous=previous, next=following,
                    shape=(sequences_per_micro_batch(model_config, assignment.d_dp), model_config.seq_len,
                           model_config.d_model), data_period=model_config.data_period)
    if wire.activation_deltas:
        _check_deltas(plan, config)
    streams = NeighbourStreams(p2p, plan, namespace=stage_namespace(swarm), frame_timeout_s=config.frame_timeout_s)
    members = [PeerID.from_base58(pipeline[role.stage]) for pipeline in assignment.pipelines]  # stage replicas
    tag = round_tag(swarm, assignment.version, role.stage)
    group = StageGroup(p2p, members, namespace=allreduce_namespace(swarm, role.stage), round_tag=tag,
                       sender_timeout_s=config.sender_timeout_s, reducer_timeout_s=config.reducer_timeout_s,
                       aggregation=assignment.aggregation, codec=wire.allreduce, private_key=identity)

    everyone = [PeerID.from_base58(peer) for peer in assignment.roles]
    board = CommitBoard(p2p, everyone, namespace=commit_namespace(swarm, assignment.version), private_key=identity)
    tied = TiedMatrix.of_plan(module, assignment, p2p=p2p, swarm=swarm, sender_timeout_s=config.sender_timeout_s,
                              reducer_timeout_s=config.reducer_timeout_s)
    optimizer = config.build_optimizer(module.parameters())
    replicas = ReplicaSync(p2p, members, module, optimizer, namespace=replica_namespace(swarm, role.stage),
                           round_tag=tag, timeout_s=config.commit_timeout_s)

    streams.advance_to(assignment.step)  # a plan that starts mid-training takes frames of its first step at once
    worker = StageWorker(module, streams=streams, group=group, board=board, replicas=replicas, data=data,
                       model_config=model_config, pipeline=role.replica, n_pipelines=assignment.d_dp, device=device,
                       config=config, optimizer=optimizer, stage=role.stage, d_pp=assignment.d_pp,
                       schedule=assignment.schedule, emulated_tflops=emulated_tflops,
                       eval_every=_eval_every(assignment, data), tied=tied)
    try:
        await board.attach()  # before the streams: a peer that answers a ping serves every handler
        await replicas.attach()
        await group.attach()
        if tied is not None:
            await tied.attach()
        await streams.attach()
        await streams.wait_for([peer for peer in (previous, following, *members, *(tied.members if tied else ()))
                                if peer], config.start_timeout_s)
    except BaseException:  # its handler names must be free for the next plan's worker
        await worker.close()
        raise
    return worker


def check_data(model: ModelConfig, data: TokenSource) -> None:
    """Raises StageError when this peer's data is not the plan's, or holds tokens beyond the model's vocabulary."""
    if data.vocab_size > model.vocab_size:
        raise StageError(f"this peer's data has a vocabulary of {data.vocab_size}, more than the {model.vocab_size} "
                         f"tokens of the plan's model {model.name!r}")
    if model.data_digest is not None and data.digest != model.data_digest:
        raise StageError(f"this peer's --data has SHA-256 {data.digest}, the plan trains on data with SHA-256 "
                         f"{model.data_digest}: another corpus, or another preparation of it")


async def _load_initial_weights(module: StageModule, model_dir: Path | None) -> None:
    """The folder's tensors of this stage, read in a worker thread (hashing a large folder takes seconds)."""
    from hetswarm.client.training.hf_folder import load_initial_weights  # transformers: only for such models

    try:
        await asyncio.to_thread(load_initial_weights, module, model_dir)
    except ConfigError as e:
        raise StageError(f"cannot start from the plan's initial weights: {e}") from e


def _check_deltas(plan: StreamPlan, config: StageConfig) -> None:
    """Activation deltas need samples that recur, and room for a pass of activation copies. The period must be at
    least 2 steps: a neighbour may send a frame of the next step before this stage commits the current one, so the
    two steps must not share samples (whose copies the commit is about to change).

    Raises:
        StageError: the plan's model has no data period (or one of a single step), or a pass of activation copies
            would take more than ``config.max_delta_bytes``.
    """
    if plan.data_period is None or plan.data_period < 2:
        raise StageError(f"activation deltas need a model data_period of at least 2 steps (samples that recur), "
                         f"got {plan.data_period}")
    need = buffer_bytes(data_period=plan.data_period, micro_batches=plan.micro_batches, shape=plan.shape)
    if need > config.max_delta_bytes:
        raise StageError(f"activation deltas keep {plan.data_period} steps × {plan.micro_batches} micro-batches of "
                         f"{list(plan.shape)} activations at each end of a link: {need / 2**20:.0f} MiB, over the "
                         f"limit of {config.max_delta_bytes / 2**20:.0f} MiB; shorten the data period or raise "
                         f"the limit")
