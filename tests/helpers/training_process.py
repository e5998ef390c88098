"""A whole training peer in one process: its DHT node, its stage, N steps, and a results file.

Used by the tests as separate processes on one machine: ``run_training_process(job)`` is the target of a
``multiprocessing`` 'forkserver' process (client/local/preimported.py): the server imports torch and hivemind once,
which every spawned trainer used to pay about 2 s of CPU for, and each child it forks is as clean as a spawned one. The DHT starts first, before any thread or heavy torch work, because hivemind forks it
(docs/hivemind.md, pitfall 3); its p2p daemon is then shared with this process's event loop through
``replicate_p2p``.

Faults (tests/test_step_faults.py) are injected by subclassing the real classes: ``FaultyNeighbourStreams`` and
``FaultyStageGroup`` replace the class of the worker's streams and group in the process that is told to misbehave,
at one chosen step and micro-batch, on the first attempt only.
"""
import asyncio
import enum
import logging
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import hivemind
import torch
from hivemind.proto import runtime_pb2
from hivemind.utils.crypto import RSAPrivateKey

from hetswarm.client.local.preimported import SERVER
from hetswarm.client.training import group_allreduce, step_commit
from hetswarm.client.training.data import TokenSource
from hetswarm.client.training.errors import FrameRefused, PartialAllReduce, StepAborted
from hetswarm.client.training.group_allreduce import ExactAllReduceRunner, StageGroup
from hetswarm.client.training.neighbour_streams import NeighbourStreams
from hetswarm.client.training.part_bounds import PartBounds
from hetswarm.client.training.stage_start import start_stage
from hetswarm.client.training.stage_worker import StageConfig, StepReport
from hetswarm.protocol.codecs import encode_tensor
from hetswarm.protocol.identity import peer_id_of
from hetswarm.protocol.records import Assignment
from hetswarm.protocol.stage_role import StageRole
from hetswarm.protocol.votes import SignedVote
from tests.helpers.dht_nodes import start_node

__all__ = ["Fault", "TrainJob", "run_training_process"]

logger = logging.getLogger(__name__)


class Fault(enum.Enum):
    NONE = enum.auto()
    ANSWER_LOST = enum.auto()
    """The frame is delivered, but the call ends as hivemind's asingle() ValueError (pitfall 13), once."""
    SEND_FAILS_AFTER_DELIVERY = enum.auto()
    """The frame is delivered, then the send raises FrameRefused as if it had failed."""
    FRAME_DROPPED = enum.auto()
    """The frame is never sent, but the send reports success: the receiver's neighbour is silent."""
    ONE_SIDED_PARTIAL_ALLREDUCE = enum.auto()
    """The all-reduce completes, but this member alone reports it partial."""
    LATE_FAILURE = enum.auto()
    """The all-reduce completes, and this member reports it partial a second later: the others have voted success by
    then (and a single stage has applied the step ahead of the decision)."""
    REPLICA_DIVERGES = enum.auto()
    """Right after its optimizer step, this replica's parameters are perturbed (a silent corruption); choose a
    step after which replicas are checked."""
    NAN_AVERAGES = enum.auto()
    """From the start, every average this member reduces for the others is NaN (its own copy is honest): a hostile
    reducer (run it with `stop_on_abort`)."""
    SKEWED_AVERAGES = enum.auto()
    """As NAN_AVERAGES, with every average 1.5 times the honest one: inside every bound, so that only re-reducing
    it (client/training/reduction_audit.py) tells."""


class _LostAnswerStub:
    """Delivers through the real stub, then fails the way hivemind does when the answer stream closes empty."""

    def __init__(self, stub) -> None:
        self.stub, self.lost = stub, False

    async def rpc_push(self, *args, **kwargs):
        response = await self.stub.rpc_push(*args, **kwargs)
        if self.lost:  # once: the retried send gets its answer
            return response
        self.lost = True
        raise ValueError("asingle() expected an iterable with exactly one item, but got an empty iterable")


class FaultyNeighbourStreams(NeighbourStreams):
    fault: Fault
    fault_at: tuple[int, int]  # (step, micro_batch) of the first attempt

    def _hit(self, kind: str, step: int, attempt: int, micro_batch: int) -> bool:
        """A training frame of the faulty step's first attempt (never a held-out one)."""
        return kind != "held-out" and attempt == 0 and (step, micro_batch) == self.fault_at

    def _stub(self, peer, header):
        stub = super()._stub(peer, header)
        if self.fault is Fault.ANSWER_LOST and self._hit(header.kind, header.step, header.attempt, header.micro_batch):
            self.fault = Fault.NONE
            return _LostAnswerStub(stub)
        return stub

    async def send(self, kind, tensor, *, step: int, micro_batch: int, attempt: int = 0) -> None:
        if not self._hit(kind, step, attempt, micro_batch):
            return await super().send(kind, tensor, step=step, micro_batch=micro_batch, attempt=attempt)
        if self.fault is Fault.FRAME_DROPPED:
            logger.info(f"fault: dropping {kind} of step {step}, micro-batch {micro_batch}")
            return
        await super().send(kind, tensor, step=step, micro_batch=micro_batch, attempt=attempt)
        if self.fault is Fault.SEND_FAILS_AFTER_DELIVERY:
            raise FrameRefused(f"fault: {kind} of step {step} delivered, reported failed")


class FaultyStageGroup(StageGroup):
    fault_step: int
    delay_s: float

    async def average(self, tensors, *, step: int, attempt: int = 0) -> None:
        await super().average(tensors, step=step, attempt=attempt)
        if (step, attempt) == (self.fault_step, 0):
            await asyncio.sleep(self.delay_s)
            raise PartialAllReduce(f"fault: all-reduce of step {step} reported partial on this member only")


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainJob:
    """Everything one training process needs; picklable, so it can cross a process boundary."""

    swarm: str
    identity_path: Path
    initial_peers: list[str]
    assignment: Assignment
    steps: int
    """Steps to train, from ``assignment.step`` on."""
    seed: int
    output_path: Path
    """Where the results go (torch.save): per-step reports, and the first step's gradients if asked for."""
    data_path: Path | None = None
    data_seed: int = 0
    save_first_grads: bool = False
    """Also save every parameter's gradient after the first step's all-reduce, by global parameter name."""
    config: StageConfig = field(default_factory=StageConfig)
    device: str = "cpu"
    torch_threads: int | None = None
    """Caps torch's intra-op threads, for several peers sharing one machine's cores."""
    fault: Fault = Fault.NONE
    """What this process does wrong: once, at ``fault_at`` (but a hostile reducer's averages, every time)."""
    fault_at: tuple[int, int] = (0, 0)
    """(step, micro_batch) of the fault."""
    save_final_state: bool = False
    """Also save the parameters after the last step, by global parameter name."""
    save_states_after: tuple[int, ...] = ()
    """Also save the parameters after each of these many steps, under "states" (a golden run's checkpoints)."""
    run_ahead: bool = True
    """Let a single stage compute the next step while the plan votes (client/training/stage_worker.py)."""
    model_dir: Path | None = None
    """This peer's copy of the folder a model with an init_digest starts from (`hetswarm join --model-dir`)."""
    stop_on_abort: bool = False
    """End the run at the first step the plan aborts `max_attempts` times, with the failure votes of the aborted
    attempts this peer holds under "aborted" (what it would show the coordinator), instead of failing."""
    unchecked: bool = False
    """Run without the checks against hostile members: averages and gradient parts taken as they come, votes
    unsigned and unverified (`_without_checks`; benchmarks/check_cost.py measures what the checks cost)."""

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise ValueError(f"steps must be at least 1, got {self.steps}")


def run_training_process(job: TrainJob) -> None:
    """Starts a DHT node with the swarm's validators, trains ``job.steps`` steps and writes the results."""
    if job.unchecked:
        _without_checks()
    dht, key = start_node(job.swarm, job.identity_path, job.initial_peers)
    try:
        if job.torch_threads is not None:
            torch.set_num_threads(job.torch_threads)
        results = asyncio.run(_train(dht, job, key))
        torch.save(results, job.output_path)
    finally:
        dht.shutdown()


async def _train(dht: hivemind.DHT, job: TrainJob, key: RSAPrivateKey) -> dict:
    p2p = await dht.replicate_p2p()
    data = TokenSource.from_path(job.data_path, seed=job.data_seed)
    me = peer_id_of(key.get_public_key())
    role = StageRole.of(job.assignment, me)
    worker = await start_stage(role, key, p2p=p2p, swarm=job.swarm, device=job.device, data=data,
                               seed=job.seed, config=job.config, model_dir=job.model_dir)
    _inject(worker, job)
    reports: list[StepReport] = []
    results: dict = {"peer_id": me, "stage": role.stage, "replica": role.pipeline}
    try:
        last = job.assignment.step + job.steps - 1
        for step in range(job.assignment.step, last + 1):
            try:
                reports.append(await worker.run_step(step, ahead=job.run_ahead and step < last))
            except StepAborted:
                if not job.stop_on_abort:
                    raise
                results["aborted"] = [aborted.dict() for aborted in worker.board.aborted(step)]
                break
            logger.info(f"step {step}: {reports[-1]}")
            if job.save_first_grads and len(reports) == 1:
                results["first_grads"] = {name: param.grad.detach().cpu().clone()
                                          for name, param in worker.module.named_parameters()}
            if len(reports) in job.save_states_after:
                results.setdefault("states", {})[len(reports)] = _parameters(worker)
        for end, deltas in (("deltas_sent", worker.streams.deltas), ("deltas_taken", worker.streams.servicer.deltas)):
            if deltas is not None:  # (whole, delta) frames of the activation link, with activation deltas on
                results[end] = (deltas.sent_whole, deltas.sent_delta)
        if job.save_final_state:
            results["final_state"] = _parameters(worker)
    finally:
        await worker.close()
        await p2p.shutdown()  # this process's client of the DHT's daemon; the daemon goes with dht.shutdown()
    results["reports"] = [asdict(report) for report in reports]
    return results


HOSTILE_REDUCER_SCALES = {Fault.NAN_AVERAGES: math.nan, Fault.SKEWED_AVERAGES: 1.5}


class _HostileAverages(ExactAllReduceRunner):
    """Answers every other member's share with the honest average times `scale` (HOSTILE_REDUCER_SCALES)."""

    scale: float

    def _outgoing_part(self, part_index: int, averaged: torch.Tensor) -> tuple[runtime_pb2.Tensor, torch.Tensor]:
        serialized, decoded = super()._outgoing_part(part_index, averaged)
        return encode_tensor(decoded * self.scale, self.codec), decoded


def _without_checks() -> None:
    """Replaces, in this process, the checks of averages, parts and votes by ones that pass everything, and runs
    all-reduces without part statements or audits."""
    PartBounds.average_refusal = lambda self, averaged, peer_index, part_index: None
    PartBounds.part_refusal = lambda self, part, part_index: None
    audited_init = ExactAllReduceRunner.__init__

    def unaudited_init(self, *args, private_key=None, **kwargs) -> None:
        audited_init(self, *args, **kwargs)

    ExactAllReduceRunner.__init__ = unaudited_init

    def unsigned_vote(private_key, *, namespace, step, attempt, ok, cause=None) -> SignedVote:
        return SignedVote(peer=peer_id_of(private_key.get_public_key()), ok=ok, cause=cause, public_key="unsigned",
                          signature="unsigned")

    step_commit.signed_vote = unsigned_vote
    step_commit.forgery = lambda vote, *, namespace, step, attempt: None


def _parameters(worker) -> dict[str, torch.Tensor]:
    return {name: param.detach().cpu().clone() for name, param in worker.module.named_parameters()}


def _inject(worker, job: TrainJob) -> None:
    """Makes this process's worker misbehave as ``job.fault`` says (a no-op for Fault.NONE)."""
    if job.fault in (Fault.ANSWER_LOST, Fault.SEND_FAILS_AFTER_DELIVERY, Fault.FRAME_DROPPED):
        worker.streams.__class__ = FaultyNeighbourStreams
        worker.streams.fault, worker.streams.fault_at = job.fault, job.fault_at
    elif job.fault in (Fault.ONE_SIDED_PARTIAL_ALLREDUCE, Fault.LATE_FAILURE):
        worker.group.__class__ = FaultyStageGroup
        worker.group.fault_step = job.fault_at[0]
        worker.group.delay_s = 1.0 if job.fault is Fault.LATE_FAILURE else 0.0
    elif job.fault in HOSTILE_REDUCER_SCALES:
        _HostileAverages.scale = HOSTILE_REDUCER_SCALES[job.fault]
        group_allreduce.ExactAllReduceRunner = _HostileAverages
    elif job.fault is Fault.REPLICA_DIVERGES:  # corrupt right after the optimizer step, before the replica check
        optimizer_step = worker.optimizer.step

        def step_then_corrupt(*args, **kwargs):
            result = optimizer_step(*args, **kwargs)
            if worker._attempt[0] == job.fault_at[0]:
                with torch.no_grad():
                    next(worker.module.parameters()).add_(1e-3)
            return result

        worker.optimizer.step = step_then_corrupt


def run_training_processes(jobs: list[TrainJob], *, timeout_s: float) -> list[dict]:
    """Runs every job in its own process (a peer each), waits for all, and returns what each saved."""
    processes = [SERVER.Process(target=run_training_process, args=(job,), daemon=False) for job in jobs]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=timeout_s)
    assert [process.exitcode for process in processes] == [0] * len(processes), "a training process failed"
    return [torch.load(job.output_path) for job in jobs]
