"""Faults a test puts into the `hetswarm` processes it starts, through the CLI's one test door: a client started with
``HETSWARM_TEST_PLUGIN=tests.helpers.process_faults:install`` (``PLUGIN``, below) calls `install` before its command
runs, and `install` reads the faults it is asked for from the process's environment:

``HETSWARM_TEST_HOSTILE_VOTES`` (tests/test_attack_votes.py)
    a file: while it exists, this peer is a member that freezes the plan, voting failure on every attempt and naming
    another member as the cause, a different one each attempt; its Progress records report a loss spike and every
    other member unreachable, and its peer record claims to follow plan version 10⁹.
``HETSWARM_TEST_CORRUPT_AFTER_STEP`` (tests/test_loss_rollback.py)
    a step: this replica's weights are scrambled right after it commits that step (once), as silent data corruption
    on a volunteer's GPU would.
``HETSWARM_TEST_COMPUTE_SCALE`` (tests/test_hostile_swarm.py)
    a factor: every compute time this peer's Progress records report is its own times that factor, as a peer that
    claims more TFLOPS than it has would report to match its claim.
``HETSWARM_TEST_FORGED_CHECKPOINTS`` (tests/test_loss_rollback.py)
    ``STEP:N_LAYERS``: this peer's record advertises, under the plan it follows, a complete checkpoint of the model's
    N_LAYERS at STEP and one of layers [0, MAX_LAYERS) at STEP, neither of which it wrote (their root is made up).
"""
from __future__ import annotations

import functools
import hashlib
import logging
import os

import torch

from hetswarm.client.cli import TEST_PLUGIN_ENV
from hetswarm.client.peer.volunteer import Volunteer
from hetswarm.client.training.plan_session import PlanSession
from hetswarm.client.training.progress_report import ProgressPublisher
from hetswarm.client.training.step_commit import CommitBoard
from hetswarm.protocol.limits import MAX_CHECKPOINTS_PER_RECORD, MAX_LAYERS, MAX_STEP, MAX_UNREACHABLE_PER_RECORD
from hetswarm.protocol.records import CheckpointInfo, PeerRecord, Progress

__all__ = ["PLUGIN", "compute_scale_env", "corrupt_after_step_env", "forged_checkpoints_env", "hostile_votes_env",
           "install"]

logger = logging.getLogger(__name__)

PLUGIN = {TEST_PLUGIN_ENV: f"{__name__}:install"}
"""What a test adds to a client's environment for `install` to run in it."""
_HOSTILE_VOTES, _CORRUPT_AFTER_STEP = "HETSWARM_TEST_HOSTILE_VOTES", "HETSWARM_TEST_CORRUPT_AFTER_STEP"
_FORGED_CHECKPOINTS, _COMPUTE_SCALE = "HETSWARM_TEST_FORGED_CHECKPOINTS", "HETSWARM_TEST_COMPUTE_SCALE"
_SPIKE = 1e5
"""The loss a hostile member reports: 10⁴ times the tiny model's."""


def hostile_votes_env(switch: os.PathLike) -> dict[str, str]:
    """A client's environment for a member that turns hostile once the file `switch` exists."""
    return PLUGIN | {_HOSTILE_VOTES: str(switch)}


def corrupt_after_step_env(step: int) -> dict[str, str]:
    """A client's environment for a replica whose weights are scrambled after it commits `step`."""
    return PLUGIN | {_CORRUPT_AFTER_STEP: str(step)}


def forged_checkpoints_env(step: int, n_layers: int) -> dict[str, str]:
    """A client's environment for a peer that advertises checkpoints of `step` it never wrote."""
    return PLUGIN | {_FORGED_CHECKPOINTS: f"{step}:{n_layers}"}


def compute_scale_env(scale: float) -> dict[str, str]:
    """A client's environment for a peer that reports its compute times `scale` times what they are."""
    return PLUGIN | {_COMPUTE_SCALE: str(scale)}


def install() -> None:
    if (switch := os.environ.get(_HOSTILE_VOTES)) is not None:
        _vote_hostile_while(switch)
    if (step := os.environ.get(_CORRUPT_AFTER_STEP)) is not None:
        _corrupt_after(int(step))
    if (scale := os.environ.get(_COMPUTE_SCALE)) is not None:
        _report_compute_scaled(float(scale))
    if (forged := os.environ.get(_FORGED_CHECKPOINTS)) is not None:
        step, n_layers = (int(part) for part in forged.split(":"))
        _advertise_forged_checkpoints(step, n_layers)


def _vote_hostile_while(switch: str) -> None:
    """While `switch` exists: every vote a failure naming another member; every Progress record a loss spike and
    every other member reported unreachable; the peer record a follower of plan version 10⁹."""
    decide, submit, record = CommitBoard.decide, ProgressPublisher.submit, Volunteer.record
    members: list[str] = []  # the others of the plan, as its commit board knows them

    @functools.wraps(decide)
    async def hostile(self: CommitBoard, key, vote, *, cause=None, timeout_s):
        others = sorted(self.members - {self.p2p.peer_id}, key=lambda peer: peer.to_bytes())
        members[:] = [peer.to_base58() for peer in others]
        if vote is not None and others and os.path.exists(switch):
            vote, cause = False, members[key[1] % len(members)]
        return await decide(self, key, vote, cause=cause, timeout_s=timeout_s)

    @functools.wraps(submit)
    def spiking(self: ProgressPublisher, progress: Progress) -> None:
        if os.path.exists(switch):
            progress = progress.copy(update={"loss": _SPIKE, "recent_losses": [_SPIKE],
                                             "unreachable": members[:MAX_UNREACHABLE_PER_RECORD]})
        submit(self, progress)

    @functools.wraps(record)
    def inflated(self: Volunteer) -> PeerRecord:
        ours = record(self)
        return ours.copy(update={"assignment_version": MAX_STEP}) if os.path.exists(switch) else ours

    CommitBoard.decide, ProgressPublisher.submit, Volunteer.record = hostile, spiking, inflated


def _corrupt_after(corrupt_step: int) -> None:
    keep_state, done = PlanSession._keep_state, []

    @functools.wraps(keep_state)
    async def corrupting(self: PlanSession, step: int) -> None:
        if step == corrupt_step + 1 and not done:  # kept right after `corrupt_step` commits
            logger.warning(f"{_CORRUPT_AFTER_STEP}: scrambling this replica's weights after step {corrupt_step}")
            generator = torch.Generator().manual_seed(corrupt_step)
            with torch.no_grad():
                for parameter in self.worker.module.parameters():
                    parameter.add_(torch.randn(parameter.shape, generator=generator).to(parameter) * 3.0)
            done.append(corrupt_step)
        await keep_state(self, step)

    PlanSession._keep_state = corrupting


def _advertise_forged_checkpoints(step: int, n_layers: int) -> None:
    record, made_up = Volunteer.record, hashlib.sha256(b"forged").hexdigest()

    @functools.wraps(record)
    def forging(self: Volunteer) -> PeerRecord:
        ours = record(self)
        if ours.assignment_version is None:
            return ours
        forged = [CheckpointInfo(step=step, layers=[0, end], plan_version=ours.assignment_version, root=made_up)
                  for end in (n_layers, MAX_LAYERS)]
        return ours.copy(update={"checkpoints": (forged + ours.checkpoints)[:MAX_CHECKPOINTS_PER_RECORD]})

    Volunteer.record = forging


def _report_compute_scaled(scale: float) -> None:
    submit = ProgressPublisher.submit

    @functools.wraps(submit)
    def scaled(self: ProgressPublisher, progress: Progress) -> None:
        submit(self, progress.copy(update={"compute_s": progress.compute_s * scale}))

    ProgressPublisher.submit = scaled
