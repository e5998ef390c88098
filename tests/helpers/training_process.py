"""A whole training peer in one process: its DHT node, its stage, N steps, and a results file.

Used by the tests (and the demo) as separate processes on one machine: ``run_training_process(job)`` is the
target of a ``multiprocessing`` 'spawn' process. The DHT starts first, before any thread or heavy torch work,
because hivemind forks it (docs/hivemind.md, pitfall 3); its p2p daemon is then shared with this process's
event loop through ``replicate_p2p``.
"""
import asyncio
import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path

import hivemind
import torch

from hetswarm.client.training.data import TokenSource
from hetswarm.client.training.stage_worker import StageConfig, StepReport, start_stage
from hetswarm.protocol.identity import peer_id_of
from hetswarm.protocol.records import Assignment
from tests.helpers.dht_nodes import start_node

__all__ = ["TrainJob", "run_training_process"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainJob:
    """Everything one training process needs; picklable, so it can cross a 'spawn' boundary."""

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

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise ValueError(f"steps must be at least 1, got {self.steps}")


def run_training_process(job: TrainJob) -> None:
    """Starts a DHT node with the swarm's validators, trains ``job.steps`` steps and writes the results."""
    dht, key = start_node(job.swarm, job.identity_path, job.initial_peers)
    try:
        if job.torch_threads is not None:
            torch.set_num_threads(job.torch_threads)
        results = asyncio.run(_train(dht, job, peer_id_of(key.get_public_key())))
        torch.save(results, job.output_path)
    finally:
        dht.shutdown()


async def _train(dht: hivemind.DHT, job: TrainJob, me: str) -> dict:
    p2p = await dht.replicate_p2p()
    data = TokenSource.from_path(job.data_path, seed=job.data_seed)
    worker = await start_stage(job.assignment, me, p2p=p2p, swarm=job.swarm, device=job.device, data=data,
                               seed=job.seed, config=job.config)
    reports: list[StepReport] = []
    results: dict = {"peer_id": me, "stage": job.assignment.roles[me].stage,
                     "replica": job.assignment.roles[me].replica}
    try:
        for step in range(job.assignment.step, job.assignment.step + job.steps):
            reports.append(await worker.run_step(step))
            logger.info(f"step {step}: {reports[-1]}")
            if job.save_first_grads and len(reports) == 1:
                results["first_grads"] = {name: param.grad.detach().cpu().clone()
                                          for name, param in worker.module.named_parameters()}
    finally:
        await worker.close()
        await p2p.shutdown()  # this process's client of the DHT's daemon; the daemon goes with dht.shutdown()
    results["reports"] = [asdict(report) for report in reports]
    return results
