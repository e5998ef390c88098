"""One stage of one pipeline, trained in lock-step with the rest of the swarm.

A step is GPipe over the assignment's M micro-batches: every forward, then every backward in reverse order,
then the stage group's all-reduce of the gradients, then the optimizer step. The first stage draws its inputs
from the TokenSource, the last stage draws the same micro-batches for their targets (the data is a pure function
of step, pipeline and micro-batch, so the two ends agree without talking); the stages between only relay.
Gradients follow the loss convention of hetswarm.client.training.reference: the last stage backpropagates CE / M, the
group all-reduce averages, so one step here equals ``reference_step`` on the same batch.

Compute runs in a worker thread, so this peer's event loop keeps taking frames and all-reduce parts while it
computes. On CUDA the forward pass runs under bf16 autocast with fp32 weights; every tensor that leaves the
peer is moved to the CPU first.
"""
import asyncio
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from hivemind.p2p import P2P, PeerID

from hetswarm.client.training.data import TokenSource, sequences_per_micro_batch
from hetswarm.client.training.group_allreduce import StageGroup
from hetswarm.client.training.model import StageModule, build_stage
from hetswarm.client.training.reference import micro_batch_loss
from hetswarm.client.training.errors import StageError
from hetswarm.client.training.neighbour_streams import StreamPlan, NeighbourStreams
from hetswarm.protocol.keys import allreduce_namespace, stage_namespace
from hetswarm.protocol.model_config import ModelConfig
from hetswarm.protocol.records import Assignment, PeerId
from hetswarm.protocol.errors import ConfigError

__all__ = ["StageConfig", "StageWorker", "StepReport", "start_stage"]


@dataclass(frozen=True, kw_only=True, slots=True)
class StageConfig:
    """How a stage trains and how long it waits for its peers; every peer of a swarm must use the same."""

    lr: float = 1e-3
    weight_decay: float = 0.1
    wire_dtype: torch.dtype = torch.float32
    """dtype of activations and their gradients on the wire; bf16 halves the bytes, fp32 keeps exactness."""
    frame_timeout_s: float = 60.0
    """Deadline for a neighbour's frame, counted from when the worker starts waiting for it."""
    sender_timeout_s: float = 30.0
    """How late a group member may start its all-reduce before it is left out (and the round is partial)."""
    reducer_timeout_s: float = 60.0
    start_timeout_s: float = 60.0
    """How long start_stage waits for the neighbours and the group to come up."""

    def __post_init__(self) -> None:
        if self.lr <= 0 or self.weight_decay < 0:
            raise ConfigError(f"need lr > 0 and weight_decay >= 0, got {self.lr} and {self.weight_decay}")
        if self.wire_dtype not in (torch.float32, torch.bfloat16, torch.float16):
            raise ConfigError(f"wire_dtype must be float32, bfloat16 or float16, got {self.wire_dtype}")
        if not 0 < self.sender_timeout_s < self.reducer_timeout_s:
            raise ConfigError(f"need 0 < sender_timeout_s < reducer_timeout_s, got {self.sender_timeout_s} "
                             f"and {self.reducer_timeout_s}")
        if self.frame_timeout_s <= 0 or self.start_timeout_s <= 0:
            raise ConfigError(f"timeouts must be positive, got {self.frame_timeout_s} and {self.start_timeout_s}")

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
    tokens: int
    """Tokens this pipeline trained on in the step."""

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s if self.wall_s > 0 else 0.0


class StageWorker:
    """Holds a stage's module and optimizer and runs its steps; ``start_stage`` builds one."""

    def __init__(
        self, module: StageModule, *, streams: NeighbourStreams, group: StageGroup, data: TokenSource,
        model_config: ModelConfig, pipeline: int, n_pipelines: int, device: torch.device, config: StageConfig,
    ) -> None:
        self.module, self.streams, self.group, self.data = module, streams, group, data
        self.model_config, self.pipeline, self.n_pipelines = model_config, pipeline, n_pipelines
        self.device, self.config = device, config
        self.micro_batches = model_config.micro_batches
        self.micro_batch_size = sequences_per_micro_batch(model_config, n_pipelines)
        self.optimizer = config.build_optimizer(module.parameters())
        self.next_step: int | None = None
        self._compute_s = self._wait_s = 0.0  # of the step being run

    async def close(self) -> None:
        """Stops serving this stage's handlers (a new assignment builds a new worker)."""
        await self.streams.detach()
        await self.group.detach()

    async def run_step(self, step: int) -> StepReport:
        """Trains one step; steps must come in increasing order.

        Raises:
            StageError: a neighbour refused or withheld a frame, or the all-reduce was partial; the optimizer
                was not stepped, so the parameters are still those of the step before.
        """
        if self.next_step is not None and step < self.next_step:
            raise ConfigError(f"steps only go forward: step {step} was asked for after step {self.next_step - 1}")
        self.next_step = step + 1
        self.streams.advance_to(step)
        self.optimizer.zero_grad(set_to_none=True)
        started, self._compute_s, self._wait_s = time.perf_counter(), 0.0, 0.0
        try:
            async with asyncio.TaskGroup() as sends:
                outputs, inputs = await self._forward_all(step, sends)
                loss = await self._backward_all(step, outputs, inputs, sends)
        except* StageError as failures:
            raise failures.exceptions[0] from None
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.module.parameters()]
        await self._waiting(self.group.average(grads, step=step))
        for param, grad in zip(self.module.parameters(), grads):
            param.grad = grad
        await self._computing(self.optimizer.step)
        return StepReport(step=step, loss=loss, compute_s=self._compute_s, wait_s=self._wait_s,
                          wall_s=time.perf_counter() - started,
                          tokens=self.micro_batches * self.micro_batch_size * self.model_config.seq_len)

    async def _forward_all(self, step: int, sends: asyncio.TaskGroup) -> tuple[list, list]:
        """Forward every micro-batch; returns what the backward pass needs: outputs (or losses) and inputs."""
        outputs, inputs = [], []
        for m in range(self.micro_batches):
            tokens, targets = self.data.batch(step=step, pipeline=self.pipeline, n_pipelines=self.n_pipelines,
                                              micro_batch=m, micro_batch_size=self.micro_batch_size,
                                              seq_len=self.model_config.seq_len)  # (B, T), (B, T)
            if self.module.is_first:
                x = tokens.to(self.device)
            else:
                received = await self._waiting(self.streams.receive("activations", step=step, micro_batch=m))
                x = received.to(self.device, torch.float32).requires_grad_()  # (B, T, C)
            out = await self._computing(self._forward, x, targets)
            if not self.module.is_last:
                sends.create_task(self.streams.send("activations", out, step=step, micro_batch=m))
            outputs.append(out)
            inputs.append(x)
        return outputs, inputs

    def _forward(self, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.device.type == "cuda"):
            out = self.module(x)  # (B, T, C) or logits (B, T, V)
        if self.module.is_last:
            return micro_batch_loss(out, targets.to(self.device), micro_batches=self.micro_batches)
        return out

    async def _backward_all(self, step: int, outputs: list, inputs: list, sends: asyncio.TaskGroup) -> float | None:
        """Backward every micro-batch in reverse; returns the pipeline's loss on the last stage, else None."""
        for m in reversed(range(self.micro_batches)):
            if self.module.is_last:
                await self._computing(outputs[m].backward)
            else:
                grad = await self._waiting(self.streams.receive("gradients", step=step, micro_batch=m))
                await self._computing(outputs[m].backward, grad.to(self.device, outputs[m].dtype))
            if not self.module.is_first:
                sends.create_task(self.streams.send("gradients", inputs[m].grad, step=step, micro_batch=m))
        return sum(loss.item() for loss in outputs) if self.module.is_last else None

    async def _computing(self, fn: Callable, *args):
        """Runs ``fn`` in a worker thread, counting its time as compute (the device synchronized on CUDA)."""
        def timed():
            result = fn(*args)
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            return result

        started = time.perf_counter()
        try:
            return await asyncio.to_thread(timed)
        finally:
            self._compute_s += time.perf_counter() - started

    async def _waiting(self, awaitable):
        started = time.perf_counter()
        try:
            return await awaitable
        finally:
            self._wait_s += time.perf_counter() - started


async def start_stage(
    assignment: Assignment, me: PeerId, *, p2p: P2P, swarm: str, device: torch.device | str, data: TokenSource,
    seed: int, config: StageConfig = StageConfig(),
) -> StageWorker:
    """Builds this peer's stage of the plan, serving its neighbour streams and its group, once all its peers answer.

    Every peer of the swarm must pass the same ``swarm``, ``data``, ``seed`` and ``config``: replicas start
    from identical weights and the two ends of a pipeline draw the same micro-batches.

    Raises:
        StageError: ``me`` has no role in the assignment, or its peers did not come up in time.
    """
    if me not in assignment.roles:
        raise StageError(f"{me} has no role in assignment version {assignment.version}")
    role, device = assignment.roles[me], torch.device(device)
    my_pipeline = assignment.pipelines[role.replica]  # its peers, in stage order
    model_config = assignment.model_config()  # checked where the assignment was accepted
    module = build_stage(model_config, role.stage, assignment.d_pp, seed=seed, device=device,
                         stage_layers=assignment.stage_layers)  # only its layers, cut as the plan says

    neighbours = [my_pipeline[s] if 0 <= s < assignment.d_pp else None for s in (role.stage - 1, role.stage + 1)]
    previous, following = (PeerID.from_base58(peer) if peer else None for peer in neighbours)
    plan = StreamPlan(assignment_version=assignment.version, pipeline=role.replica,
                    micro_batches=assignment.micro_batches, dtype=config.wire_dtype, previous=previous, next=following,
                    shape=(sequences_per_micro_batch(model_config, assignment.d_dp), model_config.seq_len,
                           model_config.d_model))
    streams = NeighbourStreams(p2p, plan, namespace=stage_namespace(swarm), frame_timeout_s=config.frame_timeout_s)
    members = [PeerID.from_base58(pipeline[role.stage]) for pipeline in assignment.pipelines]  # stage replicas
    group = StageGroup(p2p, members, namespace=allreduce_namespace(swarm, role.stage),
                       round_tag=f"{swarm}/v{assignment.version}/stage{role.stage}",
                       sender_timeout_s=config.sender_timeout_s, reducer_timeout_s=config.reducer_timeout_s)

    streams.advance_to(assignment.step)  # a plan that starts mid-training takes frames of its first step at once
    await group.attach()  # before the streams: a peer that answers a ping then serves both
    await streams.attach()
    await streams.wait_for([peer for peer in (previous, following, *members) if peer], config.start_timeout_s)
    return StageWorker(module, streams=streams, group=group, data=data, model_config=model_config,
                       pipeline=role.replica, n_pipelines=assignment.d_dp, device=device, config=config)
