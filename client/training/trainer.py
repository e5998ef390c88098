"""What a client does with an accepted assignment: train its stage in lock-step and say how it goes.

The Volunteer hands every newly accepted Assignment to ``Trainer.follow`` as its own task. A newer version cancels
the loop of the older one, even while it is still starting; the old StageWorker is closed before the new one starts
(both serve the same handler names). A standby (no role in the plan) closes its worker and waits. After every step
the client publishes a signed ``Progress`` record (step, loss, tokens/s, compute and waiting time, and where its
state came from), which the monitor shows and the demo compares with the plan's predicted step time.

The state outlives the worker (client/training/state_handoff.py): after every committed step the trainer keeps a
copy of it to hand off, and writes a checkpoint when the plan names it its stage's saver (checkpoints.py). A new
plan starts at the newest step all its state sources hold; the stage starts from this peer's own copy when it has
one, else from the plan's sources (replicas, or checkpoint holders when the swarm resumes), else from the seed
where the plan says so. The state server runs for the trainer's whole life, so that a peer that moved away still
serves the stage it left.

Peers switch plans at slightly different moments (each polls the assignment key), so a new worker first waits
until its neighbours and stage group publish the same version in their peer records. Steps are all-or-nothing
across the plan (client/training/step_commit.py): ``StageWorker.run_step`` retries a failed step under new attempt
numbers itself, and raises StepAborted when the whole plan aborted every attempt it allowed; the loop then runs
the same step again (never the next one: no peer applied it), up to ``max_failures`` times in a row, and
otherwise waits for the coordinator's next plan. CommitUnknown (this peer could not learn whether the plan applied
the step) also ends the loop at once: neither retrying nor skipping would be safe. A step is published once.
"""
from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from dataclasses import dataclass
from pathlib import Path

import torch
from hivemind.p2p import PeerID
from hivemind.utils import get_dht_time

from hetswarm.client.peer.node import SwarmNode
from hetswarm.client.training.checkpoints import CheckpointDir, CheckpointWriter
from hetswarm.client.training.data import TokenSource
from hetswarm.client.training.errors import CommitUnknown, StageError, StepAborted
from hetswarm.client.training.stage_start import start_stage
from hetswarm.client.training.stage_state import StageState, merged, units_of_layers
from hetswarm.client.training.stage_worker import StageConfig, StageWorker, StepReport
from hetswarm.client.training.state_handoff import (
    HandoffReport,
    StateServer,
    StateStore,
    agree_on_step,
    fetch_state,
)
from hetswarm.protocol.errors import ConfigError
from hetswarm.protocol.keys import state_namespace
from hetswarm.protocol.limits import MAX_LOSS, MAX_RECENT_LOSSES, MAX_UNREACHABLE_PER_RECORD
from hetswarm.protocol.record_store import check_ttl
from hetswarm.protocol.records import Assignment, CheckpointInfo, Health, PeerRole, Progress, StateOrigin

__all__ = ["Trainer", "TrainerConfig", "TrainingSetup", "recordable_loss"]

logger = logging.getLogger(__name__)

@dataclass(frozen=True, kw_only=True, slots=True)
class TrainerConfig:
    """How long a client trains and how it reports; ``stage`` must be the same on every peer of a swarm."""

    stage: StageConfig = StageConfig()
    max_steps: int | None = None
    """Train up to (not including) this absolute step number, then keep serving idle; None trains forever.
    Absolute, so that every peer of a pipeline stops after the same step and none waits for a missing frame."""
    max_failures: int = 6
    """Aborted runs of the same step in a row (each of StageConfig.max_attempts attempts) after which the client
    stops and waits for a new assignment."""
    ttl_s: float = 60.0
    """Expiry of the Progress record, as the peer record's."""
    peer_wait_s: float = 30.0
    """How long a new worker waits for its neighbours and group to announce the same plan version; 0 for peers
    driven without a Volunteer (which is what publishes the version)."""
    heartbeat_s: float = 2.0
    """While training, the peers this stage talks to are pinged this often: a stream to a dead peer may hang for
    the whole frame timeout, a failed ping shows within seconds."""
    heartbeat_misses: int = 2
    """Failed pings in a row after which a peer is reported unreachable to the coordinator. Only failures count,
    not late answers: on a slow link a ping waits behind activations, and a busy peer answers late."""
    checkpoint_dir: Path | None = None
    """Where this peer keeps checkpoints (client/training/checkpoints.py); None: it writes none."""
    handoff_timeout_s: float = 600.0
    """Deadline of one unit's download when taking over a stage's state."""
    agree_timeout_s: float = 30.0
    """How long a peer starting a hand-off plan waits for the plan's state sources to say which step they hold."""
    emulated_tflops: float | None = None
    """Every computation of this peer takes as long as on a device of this speed (`hetswarm join --emulate-tflops`)."""
    model_dir: Path | None = None
    """This peer's copy of the Hugging Face folder a plan's model may start from (`hetswarm join --model-dir`)."""

    def __post_init__(self) -> None:
        if self.max_steps is not None and self.max_steps < 1:
            raise ConfigError(f"max_steps must be at least 1, got {self.max_steps}")
        if self.emulated_tflops is not None and not self.emulated_tflops > 0:
            raise ConfigError(f"emulated_tflops must be positive, got {self.emulated_tflops}")
        if self.heartbeat_s <= 0 or self.heartbeat_misses < 1:
            raise ConfigError(f"need heartbeat_s > 0 and heartbeat_misses >= 1, got {self.heartbeat_s} and "
                              f"{self.heartbeat_misses}")
        check_ttl(self.ttl_s)
        if self.max_failures < 1:
            raise ConfigError(f"need max_failures >= 1, got {self.max_failures}")


_RETRY_PAUSE_S = 0.5
"""Pause after a failed step, so that a refusal (a neighbour still switching plans) does not spin."""



@dataclass(frozen=True, kw_only=True, slots=True)
class TrainingSetup:
    """What `hetswarm join --coordinator ...` trains with: --data, --seed, --max-steps, --torch-threads."""

    data_path: Path | None = None
    """A text file or folder; None trains on the built-in corpus."""
    seed: int = 0
    """Model initialisation and batch sampling; every peer of a swarm must use the same."""
    config: TrainerConfig = TrainerConfig()
    torch_threads: int | None = None
    """Caps torch's intra-op threads, for several clients sharing one machine's cores."""

    def build(self, node: SwarmNode, device: torch.device) -> Trainer:
        if self.torch_threads is not None:
            torch.set_num_threads(self.torch_threads)
        data = TokenSource.from_path(self.data_path, seed=self.seed)
        return Trainer(node, data=data, device=device, seed=self.seed, config=self.config)


class Trainer:
    """Runs this peer's StageWorker for the newest accepted assignment; ``follow`` is the Volunteer's hook."""

    def __init__(self, node: SwarmNode, *, data: TokenSource, device: torch.device | str, seed: int,
                 config: TrainerConfig = TrainerConfig()) -> None:
        self.node, self.data, self.device, self.seed, self.config = node, data, torch.device(device), seed, config
        self.assignment: Assignment | None = None
        self.worker: StageWorker | None = None
        self.last_report: StepReport | None = None
        self.finished = asyncio.Event()
        """Set once the loop of the current assignment has reached ``max_steps``."""
        self._loop_task: asyncio.Task | None = None
        self._published: tuple[int, int] = (-1, -1)
        """(assignment version, step) of the last Progress record submitted."""
        self._switching = asyncio.Lock()
        self._progress = _ProgressPublisher(node, ttl_s=config.ttl_s)
        self._step = 0
        """The step the training loop is on, for reports made beside it (the heartbeat)."""
        self._recent_losses: collections.deque[tuple[int, float]] = collections.deque(maxlen=MAX_RECENT_LOSSES)
        """(step, loss) of the last consecutive steps this peer committed (last stage only)."""
        self._held_out: tuple[int, float] | None = None
        """(step, held-out loss) of the newest evaluation (last stage only)."""
        checkpoints = CheckpointDir(config.checkpoint_dir, node.config.swarm) if config.checkpoint_dir else None
        self.store = StateStore(checkpoints)
        """The states this peer hands off to others: its last committed ones and its checkpoints."""
        self._server = StateServer(node.p2p, self.store, namespace=state_namespace(node.config.swarm))
        self._serving = False
        self.checkpoints = CheckpointWriter(checkpoints) if checkpoints is not None else None
        self.origin: tuple[StateOrigin, HandoffReport] | None = None
        """Where the current stage's state came from, and what moved."""

    async def serve(self) -> None:
        """Starts serving the states this peer holds (its checkpoints, before any plan: a swarm that restarts
        resumes from them); `follow` calls it too."""
        if not self._serving:
            await self._server.attach()
            self._serving = True

    def checkpoint_infos(self) -> list[CheckpointInfo]:
        """The checkpoints this peer holds, for its record (blocking: reads the folder)."""
        return self.checkpoints.checkpoints.infos() if self.checkpoints is not None else []

    async def follow(self, assignment: Assignment) -> None:
        """Trains this peer's part of ``assignment`` until a newer one arrives, max_steps is reached, or too
        many steps fail in a row; older or repeated versions are ignored."""
        if self.assignment is not None and assignment.version <= self.assignment.version:
            return
        self.assignment = assignment
        if self._loop_task is not None:  # an older plan's training, or its switch still waiting for peers or state
            self._loop_task.cancel()
        async with self._switching:  # one switch at a time, in version order
            if assignment is not self.assignment:
                return  # an even newer version arrived while we waited
            await self.serve()
            if self._loop_task is not None:
                await asyncio.gather(self._loop_task, return_exceptions=True)
            self.finished.clear()
            self._loop_task = asyncio.current_task()
            try:
                started = await self._switch_worker(assignment)
            except StageError as e:
                logger.warning(f"Could not start the stage of assignment {assignment.version}: {e}; "
                               f"waiting for a new assignment")
                self._report_trouble(assignment, assignment.step, "stalled", e)
                return
        if started is not None:
            worker, assignment = started
            heartbeat = asyncio.create_task(self._watch_peers(worker, assignment))
            try:
                await self._train(worker, assignment)
            finally:
                heartbeat.cancel()

    async def close(self) -> None:
        """Stops training and serving the stage; publishes what is still queued."""
        async with self._switching:
            if self._loop_task is not None and self._loop_task is not asyncio.current_task():
                self._loop_task.cancel()
                await asyncio.gather(self._loop_task, return_exceptions=True)
            await self._close_worker()
            if self._serving:
                with contextlib.suppress(Exception):
                    await self._server.detach()
        if self.checkpoints is not None:
            await self.checkpoints.close()
        await self._progress.close()

    async def _switch_worker(self, assignment: Assignment) -> tuple[StageWorker, Assignment] | None:
        """Closes the old worker and starts the one this assignment asks for; None when this peer is a standby.
        The assignment returned carries the step the plan really starts at (`_start_step`)."""
        role = assignment.roles.get(self.node.peer_id)
        await self._close_worker()
        self.store.version = assignment.version  # our states of older plans are final now
        if role is None:
            logger.info(f"Assignment {assignment.version}: standby (no role in this plan)")
            return None
        started = asyncio.get_running_loop().time()
        assignment = assignment.copy(update={"step": await self._start_step(assignment)})
        logger.info(f"Assignment {assignment.version}: stage {role.stage} of pipeline {role.replica}, "
                    f"from step {assignment.step}")
        await self._wait_for_peers(assignment, role)
        logger.debug(f"Peers on version {assignment.version} after {asyncio.get_running_loop().time() - started:.1f} s")
        state = await self._state_for(assignment, role)
        worker = self.worker = await start_stage(  # cancelled, it closes what it built (stage_worker.py)
            assignment, self.node.private_key, p2p=self.node.p2p, swarm=self.node.config.swarm, device=self.device,
            data=self.data, seed=self.seed, config=self.config.stage, emulated_tflops=self.config.emulated_tflops,
            model_dir=self.config.model_dir)
        if state is not None:
            state.apply(worker.module, worker.optimizer)
        self.store.remember(await asyncio.to_thread(StageState.capture, worker.module, worker.optimizer,
                                                    assignment.step))
        logger.info(f"Stage {role.stage} ready after {asyncio.get_running_loop().time() - started:.1f} s")
        return worker, assignment

    async def _start_step(self, assignment: Assignment) -> int:
        """The plan's step; for a hand-off, the newest step all its sources hold (state_handoff.agree_on_step)."""
        handoff = assignment.handoff
        if handoff is None or handoff.resumed_from_checkpoint or not handoff.sources:
            return assignment.step
        agreed = await agree_on_step(self.node.p2p, [PeerID.from_base58(peer) for peer in handoff.sources],
                                     store=self.store, version=assignment.version,
                                     namespace=state_namespace(self.node.config.swarm),
                                     timeout_s=self.config.agree_timeout_s)
        if agreed.gone:  # the plan counts on their state: the coordinator should hear at once, not when they expire
            self._report_trouble(assignment, assignment.step, "retrying", StageError(
                f"state source(s) {', '.join(map(str, agreed.gone))} cannot be dialled", peers=agreed.gone))
        return assignment.step if agreed.step is None else agreed.step

    async def _state_for(self, assignment: Assignment, role: PeerRole) -> StageState | None:
        """The state this stage starts from at the plan's step: kept here (memory or checkpoint), or handed off by
        the peers that hold it (client/training/state_handoff.py); None where the plan says the seed.

        Raises:
            StateUnavailable: the plan says the state exists, but no peer asked holds it.
        """
        model, handoff, step = assignment.model_config(), assignment.handoff, assignment.step
        if handoff is not None and handoff.resumed_from_checkpoint:
            self.store.forget_after(step)
        units = units_of_layers(tuple(assignment.stage_layers[role.stage]), model.n_layers)
        seeded = set(units) if handoff is None else {
            unit for a, b in handoff.seeded_layers for unit in units_of_layers((a, b), model.n_layers)}
        local = await asyncio.to_thread(self.store.find_part, step, units)  # a new cut may leave us a part
        held = set() if local is None else set(local.units)
        missing = [unit for unit in units if unit not in seeded and unit not in held]
        if not missing:
            origin: StateOrigin = "seed" if local is None else "kept"
            self.origin = (origin, HandoffReport(step=step, bytes=0, seconds=0.0))
            logger.info(f"Stage {role.stage} starts at step {step} from "
                        f"{'the seed' if local is None else 'the state this peer holds'}")
            return local
        candidates = [*handoff.sources, *(chain[role.stage] for chain in assignment.pipelines)][:64]
        state, report = await fetch_state(
            self.node.p2p, [PeerID.from_base58(peer) for peer in candidates], step=step, units=missing, model=model,
            namespace=state_namespace(self.node.config.swarm), timeout_s=self.config.handoff_timeout_s,
            roots=handoff.checkpoint_roots if handoff.resumed_from_checkpoint else ())
        self.origin = ("checkpoint" if handoff.resumed_from_checkpoint else "handed off", report)
        lost = sorted(seeded & set(units) - held)
        logger.info(f"Stage {role.stage} state for step {step} handed off: {report.describe()}"
                    f"{' (from checkpoints)' if handoff.resumed_from_checkpoint else ''}"
                    f"{'; held here: ' + ', '.join(sorted(held)) if held else ''}"
                    f"{'; from the seed: ' + ', '.join(lost) if lost else ''}")
        return merged(local, state)

    async def _wait_for_peers(self, assignment: Assignment, role: PeerRole) -> None:
        """Until the peers this stage talks to say, in their records, that they follow this version too."""
        talks_to = _talks_to(assignment, role, self.node.peer_id)
        deadline = asyncio.get_running_loop().time() + self.config.peer_wait_s
        while talks_to and self.config.peer_wait_s > 0 and asyncio.get_running_loop().time() < deadline:
            try:
                records = await self.node.records.peers(prefer=talks_to)
            except TimeoutError:
                continue
            talks_to = {p for p in talks_to
                        if p not in records or (records[p].assignment_version or 0) < assignment.version}
            if talks_to:
                await asyncio.sleep(0.5)
        if talks_to and self.config.peer_wait_s > 0:
            logger.info(f"{len(talks_to)} peer(s) have not announced version {assignment.version} yet; starting anyway")

    async def _close_worker(self) -> None:
        if self.worker is not None:
            with contextlib.suppress(Exception):  # handlers of a dying p2p may already be gone
                await self.worker.close()
        self.worker = None

    async def _watch_peers(self, worker: StageWorker, assignment: Assignment) -> None:
        """Pings the peers this stage talks to every heartbeat; those whose pings failed `heartbeat_misses` times in a
        row are reported unreachable at once (and again whenever that set changes).

        A ping is never cancelled: one still in flight at the next heartbeat just counts as late, and no second one
        is sent to that peer. (hivemind 1.1.12's control client stopped reading p2pd's answers when one came for a
        call just cancelled; client/peer/hivemind_compat/control.py repairs that.)"""
        peers = sorted(_talks_to(assignment, assignment.roles[self.node.peer_id], self.node.peer_id))
        misses, reported = dict.fromkeys(peers, 0), set()
        in_flight: dict[str, asyncio.Task] = {}
        while peers:
            await asyncio.sleep(self.config.heartbeat_s)
            for peer in peers:
                ping = in_flight.get(peer)
                if ping is not None and not ping.done():
                    continue  # late: says nothing
                if ping is not None:
                    misses[peer] = misses[peer] + 1 if ping.result() == "failed" else 0
                in_flight[peer] = asyncio.create_task(worker.streams.ping(PeerID.from_base58(peer), timeout_s=None))
            silent = {peer for peer, count in misses.items() if count >= self.config.heartbeat_misses}
            if silent and silent != reported:
                error = StageError(f"{', '.join(sorted(silent))} failed {self.config.heartbeat_misses} pings in a row",
                                   peers=sorted(silent))
                logger.warning(f"Reporting unreachable peers: {error}")
                self._report_trouble(assignment, self._step, "retrying", error, worker)
            reported = silent

    async def _train(self, worker: StageWorker, assignment: Assignment) -> None:
        step, failures, max_steps = assignment.step, 0, self.config.max_steps
        worker.on_failure = lambda error: self._report_trouble(assignment, step, "retrying", error, worker)
        while max_steps is None or step < max_steps:
            self._step = step
            try:
                report = await worker.run_step(step, ahead=max_steps is None or step + 1 < max_steps)
            except CommitUnknown as e:
                logger.warning(f"Step {step}: {e}; waiting for a new assignment")
                self._report_trouble(assignment, step, "stalled", e, worker)
                return
            except StageError as e:
                failures += 1
                logger.warning(f"Step {step} failed ({failures}/{self.config.max_failures}), retrying it: {e}")
                if failures >= self.config.max_failures:
                    logger.warning(f"Step {step} failed {failures} times in a row; stalled, waiting for a new "
                                   f"assignment")
                    self._report_trouble(assignment, step, "stalled", e, worker)
                    return
                if isinstance(e, StepAborted):  # at once, with the votes that aborted it (`_report_trouble`)
                    self._report_trouble(assignment, step, "retrying", e, worker)
                await asyncio.sleep(_RETRY_PAUSE_S)
                continue  # the same step: no peer of the plan applied it
            failures = 0
            self.last_report = report
            await self._keep_state(worker, assignment, report.step + 1)
            if (assignment.version, report.step) > self._published:  # never publish a step twice
                self._published = (assignment.version, report.step)
                published = recordable_loss(report.loss, report.step)
                self._remember_loss(report.step, published)
                self._remember_held_out(report)
                self._progress.submit(Progress(
                    peer_id=self.node.peer_id, assignment_version=assignment.version, step=report.step, loss=published,
                    recent_losses=[loss for _, loss in self._recent_losses],
                    **self._held_out_fields(), tokens_per_s=report.tokens_per_s, compute_s=report.compute_s,
                    wait_s=report.wait_s, window_s=report.window_s, round_trip_s=report.round_trip_s,
                    retries=report.retries, resyncs=report.resyncs, **self._origin_fields(),
                    aborted=worker.board.aborted(report.step), updated_at=get_dht_time()))
            loss = "" if report.loss is None else f"loss {report.loss:.6f}, "
            if report.held_out_loss is not None:
                loss += f"held-out loss {report.held_out_loss:.6f}, "
            retried = f", after {report.attempt} retries" if report.attempt else ""
            logger.info(f"step {report.step}: {loss}{report.tokens_per_s:.0f} tokens/s, wall {report.wall_s:.3f} s "
                        f"(compute {report.compute_s:.3f} s, wait {report.wait_s:.3f} s{retried})")
            step += 1
        logger.info(f"Reached step {max_steps}: training done; serving until stopped")
        self.finished.set()

    async def _keep_state(self, worker: StageWorker, assignment: Assignment, step: int) -> None:
        """Keeps a copy of the state ready for `step` to hand off, and checkpoints it when the plan says so."""
        state = await asyncio.to_thread(StageState.capture, worker.module, worker.optimizer, step)
        self.store.remember(state)
        plan, role = assignment.checkpoints, assignment.roles[self.node.peer_id]
        if (self.checkpoints is not None and plan is not None and step % plan.every == 0
                and plan.savers[role.stage] == self.node.peer_id):
            self.checkpoints.submit(state, layers=tuple(assignment.stage_layers[role.stage]),
                                    model=assignment.model_config(), plan_version=assignment.version)

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

    def _report_trouble(self, assignment: Assignment, step: int, health: Health, error: StageError,
                        worker: StageWorker | None = None) -> None:
        """Tells the coordinator at once (a Progress record) that this peer cannot train `step`, why, which peers
        of the plan it could not reach, so that it can re-plan before their records expire, and the signed failure
        votes of the last attempts the plan aborted (every record carries them), so that it can leave out whoever
        caused them."""
        self._progress.submit(Progress(
            peer_id=self.node.peer_id, assignment_version=assignment.version, step=step, loss=None,
            tokens_per_s=0.0, compute_s=0.0, wait_s=0.0, retries=worker.retries if worker else 0,
            resyncs=worker.resyncs if worker else 0, health=health, reason=str(error)[:256],
            unreachable=[peer for peer in dict.fromkeys(error.peers) if peer in assignment.roles][:MAX_UNREACHABLE_PER_RECORD],
            aborted=worker.board.aborted(step) if worker else [],
            updated_at=get_dht_time(), **(self._origin_fields() if worker else {})))  # with a worker, it holds state


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


def _talks_to(assignment: Assignment, role: PeerRole, me: str) -> set[str]:
    """The peers a stage exchanges frames, votes or gradients with: its pipeline neighbours and its stage group."""
    pipeline = assignment.pipelines[role.replica]
    peers = {pipeline[s] for s in (role.stage - 1, role.stage + 1) if 0 <= s < assignment.d_pp}
    peers |= {chain[role.stage] for chain in assignment.pipelines}
    return peers - {me}


class _ProgressPublisher:
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
