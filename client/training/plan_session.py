"""One accepted assignment on this peer, from its start to the next plan (client/training/trainer.py swaps them).

A session starts at the plan's step or, for a hand-off, at the newest step all its state sources hold; waits until
the peers its stage talks to publish the same version in their records (peers switch plans at slightly different
moments); takes its stage's state (client/training/state_handoff.py: kept here, handed off, from checkpoints, or the
seed); and builds the stage (client/training/stage_start.py). Then it trains step after step, pinging the peers it
talks to every heartbeat and reporting the silent ones at once, keeps a copy of every committed state to hand off
(and a checkpoint where the plan names it its stage's saver), and publishes a Progress record per step.

Steps are all-or-nothing across the plan (client/training/step_commit.py): ``StageWorker.run_step`` retries a failed
step under new attempt numbers itself, and raises StepAborted when the whole plan aborted every attempt it allowed;
the loop then runs the same step again (never the next one: no peer applied it), up to ``max_failures`` times in a
row, and otherwise waits for the coordinator's next plan. CommitUnknown (this peer could not learn whether the plan
applied the step) also ends the loop at once: neither retrying nor skipping would be safe. A step is published once.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import replace
from typing import TYPE_CHECKING

from hivemind.p2p import PeerID

from hetswarm.client.training.errors import CommitUnknown, StageError, StepAborted
from hetswarm.client.training.stage_start import start_stage
from hetswarm.client.training.stage_state import StageState, merged, units_of_layers
from hetswarm.client.training.stage_worker import StageWorker
from hetswarm.client.training.state_handoff import HandoffReport, agree_on_step, fetch_state
from hetswarm.protocol.keys import ReadyStep, state_namespace
from hetswarm.protocol.records import Assignment, Health, StateOrigin
from hetswarm.protocol.stage_role import StageRole

if TYPE_CHECKING:
    from hetswarm.client.training.trainer import Trainer

__all__ = ["PlanSession"]

logger = logging.getLogger(__name__)

_RETRY_PAUSE_S = 0.5
"""Pause after a failed step, so that a refusal (a neighbour still switching plans) does not spin."""


class PlanSession:
    """This peer's part of one assignment (module docstring); the trainer's node, data, state store and progress
    records serve every session."""

    def __init__(self, trainer: Trainer, assignment: Assignment, role: StageRole) -> None:
        """`role`: this peer's part in `assignment` (protocol/stage_role.py); its `first_step` is settled by `start`."""
        self.trainer, self.assignment, self.role = trainer, assignment, role
        self.worker: StageWorker | None = None
        self._step = role.first_step
        """The step the training loop is on, for reports made beside it (the heartbeat)."""

    async def start(self) -> None:
        """Settles the start step, waits for the plan's peers, takes the stage's state and builds the stage.

        Raises:
            StageError: the stage could not start (its peers did not come up, its state is nowhere).
        """
        trainer, loop = self.trainer, asyncio.get_running_loop()
        started = loop.time()
        role = self.role = replace(self.role, first_step=await self._start_step())
        self._step = role.first_step
        logger.info(f"Assignment {role.version}: stage {role.stage} of pipeline {role.pipeline}, "
                    f"from step {role.first_step}")
        await self._wait_for_peers()
        logger.debug(f"Peers on version {role.version} after {loop.time() - started:.1f} s")
        state = await self._state_for()
        worker = self.worker = await start_stage(  # cancelled, it closes what it built (stage_start.py)
            role, trainer.node.private_key, p2p=trainer.node.p2p, swarm=trainer.node.config.swarm,
            device=trainer.device, data=trainer.data, seed=trainer.seed, config=trainer.config.stage,
            emulated_tflops=trainer.config.emulated_tflops, model_dir=trainer.config.model_dir,
            on_sent=trainer.on_frame_sent)
        if state is not None:
            state.apply(worker.module, worker.optimizer)
        trainer.store.remember(await asyncio.to_thread(StageState.capture, worker.module, worker.optimizer,
                                                       role.first_step))
        logger.info(f"Stage {role.stage} ready after {loop.time() - started:.1f} s")

    async def run(self) -> None:
        """Trains until `max_steps`, a stall, or cancellation (a newer plan), the heartbeat beside it."""
        heartbeat = asyncio.create_task(self._watch_peers(self.worker))
        try:
            await self._train(self.worker)
        finally:
            heartbeat.cancel()

    async def close(self) -> None:
        if self.worker is not None:
            with contextlib.suppress(Exception):  # handlers of a dying p2p may already be gone
                await self.worker.close()
        self.worker = None

    def report_trouble(self, step: int, health: Health, error: StageError) -> None:
        """Tells the coordinator at once that this peer cannot train `step` (progress_report.py, `of_trouble`)."""
        record = self.trainer.reports.of_trouble(self.assignment, step, health, error, self.worker)
        self.trainer.progress.submit(record)

    async def _start_step(self) -> int:
        """The plan's step; for a hand-off, the newest step all its sources hold (state_handoff.agree_on_step)."""
        assignment = self.assignment
        handoff = assignment.handoff
        if handoff is None or handoff.resumed_from_checkpoint or not handoff.sources:
            return assignment.step
        agreed = await agree_on_step(self.trainer.node.p2p, [PeerID.from_base58(peer) for peer in handoff.sources],
                                     store=self.trainer.store, version=assignment.version,
                                     namespace=state_namespace(self.trainer.node.config.swarm),
                                     timeout_s=self.trainer.config.agree_timeout_s)
        if agreed.gone:  # the plan counts on their state: the coordinator should hear at once, not when they expire
            self.report_trouble(assignment.step, "retrying", StageError(
                f"state source(s) {', '.join(map(str, agreed.gone))} cannot be dialled", peers=agreed.gone))
        return assignment.step if agreed.step is None else agreed.step

    async def _state_for(self) -> StageState | None:
        """The state this stage starts from at the plan's step: kept here (memory or checkpoint), or handed off by
        the peers that hold it (client/training/state_handoff.py); None where the plan says the seed.

        Raises:
            StateUnavailable: the plan says the state exists, but no peer asked holds it.
        """
        role = self.role
        model, handoff, step = role.model, self.assignment.handoff, role.first_step
        if handoff is not None and handoff.resumed_from_checkpoint:
            self.trainer.store.forget_after(step)
        units = units_of_layers(role.layers, model.n_layers)
        seeded = set(units) if handoff is None else {
            unit for a, b in handoff.seeded_layers for unit in units_of_layers((a, b), model.n_layers)}
        local = await asyncio.to_thread(self.trainer.store.find_part, step, units)  # a new cut may leave us a part
        held = set() if local is None else set(local.units)
        missing = [unit for unit in units if unit not in seeded and unit not in held]
        if not missing:
            origin: StateOrigin = "seed" if local is None else "kept"
            self.trainer.reports.origin = (origin, HandoffReport(step=step, bytes=0, seconds=0.0))
            logger.info(f"Stage {role.stage} starts at step {step} from "
                        f"{'the seed' if local is None else 'the state this peer holds'}")
            return local
        candidates = [*handoff.sources, *role.group][:64]
        state, report = await fetch_state(
            self.trainer.node.p2p, [PeerID.from_base58(peer) for peer in candidates], step=step, units=missing,
            model=model,
            namespace=state_namespace(self.trainer.node.config.swarm), timeout_s=self.trainer.config.handoff_timeout_s,
            roots=handoff.checkpoint_roots if handoff.resumed_from_checkpoint else ())
        self.trainer.reports.origin = ("checkpoint" if handoff.resumed_from_checkpoint else "handed off", report)
        lost = sorted(seeded & set(units) - held)
        logger.info(f"Stage {role.stage} state for step {step} handed off: {report.describe()}"
                    f"{' (from checkpoints)' if handoff.resumed_from_checkpoint else ''}"
                    f"{'; held here: ' + ', '.join(sorted(held)) if held else ''}"
                    f"{'; from the seed: ' + ', '.join(lost) if lost else ''}")
        return merged(local, state)

    async def _wait_for_peers(self) -> None:
        """Until the peers this stage talks to say, in their records, that they follow this version too."""
        version, talks_to = self.role.version, set(self.role.partners)
        deadline = asyncio.get_running_loop().time() + self.trainer.config.peer_wait_s
        while talks_to and self.trainer.config.peer_wait_s > 0 and asyncio.get_running_loop().time() < deadline:
            try:
                records = await self.trainer.node.records.peers(prefer=talks_to)
            except TimeoutError:
                continue
            talks_to = {p for p in talks_to
                        if p not in records or (records[p].assignment_version or 0) < version}
            if talks_to:
                await asyncio.sleep(0.5)
        if talks_to and self.trainer.config.peer_wait_s > 0:
            logger.info(f"{len(talks_to)} peer(s) have not announced version {version} yet; starting anyway")

    async def _watch_peers(self, worker: StageWorker) -> None:
        """Pings the peers this stage talks to every heartbeat; those whose pings failed `heartbeat_misses` times in a
        row are reported unreachable at once (and again whenever that set changes).

        A ping is never cancelled: one still in flight at the next heartbeat just counts as late, and no second one
        is sent to that peer. (hivemind 1.1.12's control client stopped reading p2pd's answers when one came for a
        call just cancelled; client/peer/hivemind_compat/control.py repairs that.)"""
        peers = sorted(self.role.partners)
        misses, reported = dict.fromkeys(peers, 0), set()
        in_flight: dict[str, asyncio.Task] = {}
        while peers:
            await asyncio.sleep(self.trainer.config.heartbeat_s)
            for peer in peers:
                ping = in_flight.get(peer)
                if ping is not None and not ping.done():
                    continue  # late: says nothing
                if ping is not None:
                    misses[peer] = misses[peer] + 1 if ping.result() == "failed" else 0
                in_flight[peer] = asyncio.create_task(worker.streams.ping(PeerID.from_base58(peer), timeout_s=None))
            silent = {peer for peer, count in misses.items() if count >= self.trainer.config.heartbeat_misses}
            if silent and silent != reported:
                error = StageError(f"{', '.join(sorted(silent))} failed {self.trainer.config.heartbeat_misses} "
                                   f"pings in a row", peers=sorted(silent))
                logger.warning(f"Reporting unreachable peers: {error}")
                self.report_trouble(self._step, "retrying", error)
            reported = silent

    async def _train(self, worker: StageWorker) -> None:
        step, failures, max_steps = self.role.first_step, 0, self.trainer.config.max_steps
        worker.on_failure = lambda error: self.report_trouble(step, "retrying", error)
        while max_steps is None or step < max_steps:
            self._step = step
            try:
                report = await worker.run_step(step, ahead=max_steps is None or step + 1 < max_steps)
            except CommitUnknown as e:
                logger.warning(f"Step {step}: {e}; waiting for a new assignment")
                self.report_trouble(step, "stalled", e)
                return
            except StageError as e:
                failures += 1
                logger.warning(f"Step {step} failed ({failures}/{self.trainer.config.max_failures}), retrying it: {e}")
                if failures >= self.trainer.config.max_failures:
                    logger.warning(f"Step {step} failed {failures} times in a row; stalled, waiting for a new "
                                   f"assignment")
                    self.report_trouble(step, "stalled", e)
                    return
                if isinstance(e, StepAborted):  # at once, with the votes that aborted it (`report_trouble`)
                    self.report_trouble(step, "retrying", e)
                await asyncio.sleep(_RETRY_PAUSE_S)
                continue  # the same step: no peer of the plan applied it
            failures = 0
            self.trainer.last_report = report
            await self._keep_state(report.step + 1)
            if (record := self.trainer.reports.of_step(self.assignment, report, worker)) is not None:
                self.trainer.progress.submit(record)
            loss = "" if report.loss is None else f"loss {report.loss:.6f}, "
            if report.held_out_loss is not None:
                loss += f"held-out loss {report.held_out_loss:.6f}, "
            retried = f", after {report.attempt} retries" if report.attempt else ""
            logger.info(f"step {report.step}: {loss}{report.tokens_per_s:.0f} tokens/s, wall {report.wall_s:.3f} s "
                        f"(compute {report.compute_s:.3f} s, wait {report.wait_s:.3f} s{retried})")
            step += 1
        logger.info(f"Reached step {max_steps}: training done; serving until stopped")
        self.trainer.finished.set()

    async def _keep_state(self, step: ReadyStep) -> None:
        """Keeps a copy of the state ready for `step` to hand off, and checkpoints it when the plan says so."""
        assignment, worker = self.assignment, self.worker
        state = await asyncio.to_thread(StageState.capture, worker.module, worker.optimizer, step)
        self.trainer.store.remember(state)
        plan, role = assignment.checkpoints, self.role
        if (self.trainer.checkpoints is not None and plan is not None and step % plan.every == 0
                and plan.savers[role.stage] == role.peer_id):
            self.trainer.checkpoints.submit(state, layers=role.layers, model=role.model, plan_version=role.version)

