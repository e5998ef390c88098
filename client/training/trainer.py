"""What a client does with an accepted assignment: train its stage in lock-step and say how it goes.

The Volunteer hands every newly accepted Assignment to ``Trainer.follow`` as its own task. A newer version cancels
the loop of the older one, even while it is still starting; the old stage is closed before the new one starts
(both serve the same handler names). A standby (no role in the plan) closes its stage and waits. After every step
the client publishes a signed ``Progress`` record (client/training/progress_report.py), which the monitor shows and
the demo compares with the plan's predicted step time.

The state outlives the worker (client/training/state_handoff.py): after every committed step the trainer keeps a
copy of it to hand off, and writes a checkpoint when the plan names it its stage's saver (checkpoints.py). A new
plan starts at the newest step all its state sources hold; the stage starts from this peer's own copy when it has
one, else from the plan's sources (replicas, or checkpoint holders when the swarm resumes), else from the seed
where the plan says so. The state server runs for the trainer's whole life, so that a peer that moved away still
serves the stage it left.

Each accepted assignment with a role here is a session (client/training/plan_session.py): its start step, its
state, its worker, its heartbeat and its loop; the trainer keeps versions in order and swaps sessions.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from hetswarm.client.peer.node import SwarmNode
from hetswarm.client.training.checkpoints import CheckpointDir, CheckpointWriter
from hetswarm.client.training.data import TokenSource
from hetswarm.client.training.errors import StageError
from hetswarm.client.training.neighbour_streams import LinkObserver
from hetswarm.client.training.plan_session import PlanSession
from hetswarm.client.training.progress_report import ProgressBuilder, ProgressPublisher
from hetswarm.client.training.stage_worker import StageConfig, StepReport
from hetswarm.client.training.state_server import StateServer, StateStore
from hetswarm.protocol.errors import ConfigError
from hetswarm.protocol.keys import state_namespace
from hetswarm.protocol.record_store import check_ttl
from hetswarm.protocol.records import Assignment, CheckpointInfo
from hetswarm.protocol.stage_role import StageRole

__all__ = ["Trainer", "TrainerConfig", "TrainingSetup"]

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
    """Runs this peer's session of the newest accepted assignment; ``follow`` is the Volunteer's hook."""

    def __init__(self, node: SwarmNode, *, data: TokenSource, device: torch.device | str, seed: int,
                 config: TrainerConfig = TrainerConfig()) -> None:
        self.node, self.data, self.device, self.seed, self.config = node, data, torch.device(device), seed, config
        self.assignment: Assignment | None = None
        self.session: PlanSession | None = None
        """The session of the newest assignment with a role here; None on a standby."""
        self.last_report: StepReport | None = None
        self.finished = asyncio.Event()
        """Set once the loop of the current assignment has reached ``max_steps``."""
        self._loop_task: asyncio.Task | None = None
        self._switching = asyncio.Lock()
        self.progress = ProgressPublisher(node, ttl_s=config.ttl_s)
        self.reports = ProgressBuilder(node.peer_id)
        checkpoints = CheckpointDir(config.checkpoint_dir, node.config.swarm) if config.checkpoint_dir else None
        self.store = StateStore(checkpoints)
        """The states this peer hands off to others: its last committed ones and its checkpoints."""
        self._server = StateServer(node.p2p, self.store, namespace=state_namespace(node.config.swarm))
        self._serving = False
        self.checkpoints = CheckpointWriter(checkpoints) if checkpoints is not None else None
        self.on_frame_sent: LinkObserver | None = None
        """Told of every frame a stage of this peer delivers (the Volunteer's link measurements take them)."""

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
            session = await self._switch(assignment)
        if session is not None:
            await session.run()

    async def close(self) -> None:
        """Stops training and serving the stage; publishes what is still queued."""
        async with self._switching:
            if self._loop_task is not None and self._loop_task is not asyncio.current_task():
                self._loop_task.cancel()
                await asyncio.gather(self._loop_task, return_exceptions=True)
            await self._close_session()
            if self._serving:
                with contextlib.suppress(Exception):
                    await self._server.detach()
        if self.checkpoints is not None:
            await self.checkpoints.close()
        await self.progress.close()

    async def _switch(self, assignment: Assignment) -> PlanSession | None:
        """Closes the old session and starts the one this assignment asks for; None when this peer is a standby, or
        the stage could not start (reported: the coordinator plans without us until we can)."""
        await self._close_session()
        self.store.version = assignment.version  # our states of older plans are final now
        if self.node.peer_id not in assignment.roles:
            logger.info(f"Assignment {assignment.version}: standby (no role in this plan)")
            return None
        session = self.session = PlanSession(self, assignment, StageRole.of(assignment, self.node.peer_id))
        try:
            await session.start()
        except StageError as e:
            logger.warning(f"Could not start the stage of assignment {assignment.version}: {e}; "
                           f"waiting for a new assignment")
            session.report_trouble(assignment.step, "stalled", e)
            return None
        return session

    async def _close_session(self) -> None:
        if self.session is not None:
            await self.session.close()
        self.session = None
