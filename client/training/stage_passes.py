"""A stage's passes of one step: every micro-batch's forward and backward in the plan's pipeline schedule, the
frames to and from the neighbours, and the held-out evaluation (client/training/stage_worker.py runs the attempts).

The first stage draws its inputs from the TokenSource, the last stage draws the same micro-batches for their targets
(the data is a pure function of step, pipeline and micro-batch, so the two ends agree without talking); the stages
between only relay. Gradients follow the loss convention of hetswarm.client.training.reference: the last stage
backpropagates CE / M. Compute runs in a worker thread, so the peer's event loop keeps taking frames and all-reduce
parts while it computes; on CUDA the forward pass runs under bf16 autocast with fp32 weights, and every tensor that
leaves the peer is moved to the CPU first.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Literal

import torch

from hetswarm.client.training.data import TokenSource, sequences_per_micro_batch
from hetswarm.client.training.model import StageModule
from hetswarm.client.training.neighbour_streams import NeighbourStreams
from hetswarm.client.training.pipeline_schedule import pass_order
from hetswarm.client.training.reference import micro_batch_loss
from hetswarm.client.training.step_clock import current_clock, mark, start_clock, waiting
from hetswarm.protocol.stage_role import StageRole

__all__ = ["StagePasses", "in_thread"]

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


class StagePasses:
    """One stage of one pipeline: its module, its data and its neighbour streams."""

    def __init__(self, module: StageModule, role: StageRole, *, streams: NeighbourStreams, data: TokenSource,
                 device: torch.device, emulated_tflops: float | None = None) -> None:
        self.module, self.role, self.streams, self.data, self.device = module, role, streams, data, device
        model_config = role.model
        self.emulated_tflops = emulated_tflops
        """Every computation here takes as long as on a device of this speed (`hetswarm join --emulate-tflops`)."""
        self.micro_batches = model_config.micro_batches
        self.micro_batch_size = sequences_per_micro_batch(model_config, role.d_dp)
        a, b = module.layers
        self.forward_flops = model_config.flops_per_token_of(b - a, first=module.is_first, last=module.is_last) / 3 \
            * self.micro_batch_size * model_config.seq_len
        """One micro-batch's forward pass (a third of forward+backward, PaLM Appendix B); the backward is twice it,
        plus a forward again when the stage recomputes its activations."""

    @property
    def tokens_per_step(self) -> int:
        """Tokens this pipeline trains on in one step."""
        return self.micro_batches * self.micro_batch_size * self.role.model.seq_len

    async def run(self, step: int, attempt: int, sends: asyncio.TaskGroup) -> float | None:
        """Every micro-batch's forward and backward in the plan's schedule; returns the pipeline's loss on the last
        stage (summed in micro-batch order, whatever the schedule), else None."""
        held, losses = {}, {}  # micro-batch → (output or loss, input) until its backward
        role = self.role
        for kind, m in pass_order(role.schedule, stage=role.stage, d_pp=role.d_pp, micro_batches=self.micro_batches):
            if kind == "forward":
                held[m] = await self._forward(step, attempt, m, sends)
                continue
            output, x = held.pop(m)
            await self._backward(step, attempt, m, output, x, sends)
            if self.module.is_last:
                losses[m] = output.item()
        return sum(losses[m] for m in range(self.micro_batches)) if self.module.is_last else None

    def grads(self) -> list[torch.Tensor]:
        return [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.module.parameters()]

    async def _forward(self, step: int, attempt: int, m: int, sends: asyncio.TaskGroup,
                       kind: Literal["activations", "held-out"] = "activations") -> tuple[torch.Tensor, torch.Tensor]:
        """Micro-batch m's forward pass, its output sent on; returns what its backward needs: the output (the loss
        on the last stage) and the input. Of kind `held-out`: a micro-batch of the held-out set, without autograd."""
        training = kind == "activations"
        if training:
            tokens, targets = self.data.batch(step=self.role.model.data_step(step), pipeline=self.role.pipeline,
                                              n_pipelines=self.role.d_dp, micro_batch=m,
                                              micro_batch_size=self.micro_batch_size,
                                              seq_len=self.role.model.seq_len)  # (B, T), (B, T)
        else:
            tokens, targets = self.data.held_out_batch(micro_batch=m, micro_batch_size=self.micro_batch_size,
                                                       micro_batches=self.micro_batches,
                                                       seq_len=self.role.model.seq_len)  # (B, T), (B, T)
        if self.module.is_first:
            x = tokens.to(self.device)
        else:
            received = await waiting(self.streams.receive(kind, step=step, micro_batch=m, attempt=attempt))
            mark(f"a{m}")
            x = received.to(self.device, torch.float32)  # (B, T, C)
            if training:
                current_clock().arrived[m] = time.perf_counter()
                x = x.detach().requires_grad_()  # not the copy
        out = await self.computing(self._module_forward if training else self._forward_only, x, targets,
                                   flops=self.forward_flops)
        if not self.module.is_last:
            if training:
                current_clock().sent[m] = time.perf_counter()
            sends.create_task(self.streams.send(kind, out, step=step, micro_batch=m, attempt=attempt))
        return out, x

    async def held_out_loss(self, step: int, attempt: int) -> float | None:
        """A forward-only pass of the held-out micro-batches through the pipeline, on the weights after `step`
        (committed at `attempt`); returns their mean loss on the last stage, None elsewhere. A neighbour that fails
        it costs this measurement only: training goes on, and the next evaluation is another chance."""
        start_clock()  # its time is not the step's
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
        clock = current_clock()
        if self.module.is_last:
            await self.computing(output.backward, flops=self._backward_flops)
        else:
            grad = await waiting(self.streams.receive("gradients", step=step, micro_batch=m, attempt=attempt))
            mark(f"g{m}")
            clock.round_trip_s += time.perf_counter() - clock.sent.pop(m)
            await self.computing(output.backward, grad.to(self.device, output.dtype), flops=self._backward_flops)
        if not self.module.is_first:
            clock.window_s += time.perf_counter() - clock.arrived.pop(m)
            sends.create_task(self.streams.send("gradients", x.grad, step=step, micro_batch=m, attempt=attempt))

    @property
    def _backward_flops(self) -> float:
        return self.forward_flops * (3 if self.module.recompute else 2)

    async def computing(self, fn: Callable, *args, flops: float = 0.0):
        """Runs ``fn`` in a worker thread, counting its time as compute (the device synchronized on CUDA); when
        emulating a device, at least as long as its `flops` take there."""
        def timed():
            result = fn(*args)
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            return result

        started, clock = time.perf_counter(), current_clock()
        try:
            result = await in_thread(timed)
            if self.emulated_tflops is not None:  # as long as on the slower device this peer emulates
                await asyncio.sleep(max(0.0, flops / (self.emulated_tflops * 1e12) - (time.perf_counter() - started)))
            return result
        finally:
            clock.compute_s += time.perf_counter() - started
