"""The training objective, and the single-process step every distributed step must reproduce.

Loss convention. With P pipelines (data-parallel replicas) and M micro-batches per pipeline, the loss of a step is

    L = 1/(P·M) · Σ_p Σ_m CE(p, m)

where CE(p, m) is the mean token cross-entropy of micro-batch m of pipeline p (``model.loss``). Every micro-batch
has the same number of tokens, so L is also the mean over all tokens of the step.

How a distributed step gets ∇L:
 1. The last stage of pipeline p backpropagates ``micro_batch_loss`` = CE(p, m) / M for each micro-batch, and every
    stage of the pipeline accumulates gradients over its M micro-batches: each replica then holds the gradient of
    its own pipeline's mean loss, (1/M) Σ_m ∇CE(p, m). Earlier stages scale nothing: the 1/M is already inside
    the gradients they receive.
 2. The stage group's all-reduce AVERAGES those gradients over its P replicas with equal weights (what hivemind's
    AllReduceRunner computes by default), giving ∇L on every replica.
tests/test_stage_math.py runs this recipe by hand and checks it against ``reference_step`` within 1e-5 (fp32).
"""
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from hetswarm.client.training.data import TokenSource, sequences_per_micro_batch
from hetswarm.client.training.model import StageModule, loss
from hetswarm.protocol.model_config import ModelConfig

__all__ = ["MicroBatch", "ReferenceStep", "held_out_loss", "micro_batch_loss", "reference_step", "step_batches"]

MicroBatch = tuple[torch.Tensor, torch.Tensor]
"""(inputs, targets), both int64 of shape (B, T)."""


def micro_batch_loss(logits: torch.Tensor, targets: torch.Tensor, *, micro_batches: int) -> torch.Tensor:
    """What the last stage backpropagates for one micro-batch: CE / M, so a pipeline's gradients sum to its mean."""
    return loss(logits, targets) / micro_batches


def step_batches(source: TokenSource, config: ModelConfig, *, step: int, n_pipelines: int) -> list[list[MicroBatch]]:
    """Every micro-batch of a step, ``[pipeline][micro_batch]``, exactly as each pipeline's stages draw them."""
    size = sequences_per_micro_batch(config, n_pipelines)
    return [
        [
            source.batch(step=step, pipeline=p, n_pipelines=n_pipelines, micro_batch=m, micro_batch_size=size,
                         seq_len=config.seq_len)
            for m in range(config.micro_batches)
        ]
        for p in range(n_pipelines)
    ]


@dataclass(frozen=True, slots=True)
class ReferenceStep:
    """The loss L of a step and its gradient for every parameter, by global parameter name."""

    loss: float
    grads: dict[str, torch.Tensor]


def reference_step(model: StageModule, batches: Sequence[Sequence[MicroBatch]]) -> ReferenceStep:
    """L and ∇L of the whole model over ``batches[pipeline][micro_batch]``, in one process.

    Gradients are left in the model's ``.grad`` as well, so a caller can step an optimizer after it.
    """
    if not (model.is_first and model.is_last):
        raise ValueError(f"the reference needs the whole model, got a stage of layers {model.layers}")
    micro_batches = {len(pipeline) for pipeline in batches}
    if len(micro_batches) != 1:
        raise ValueError(f"every pipeline needs the same number of micro-batches, got {sorted(micro_batches)}")
    (m,) = micro_batches
    model.zero_grad(set_to_none=True)
    pipeline_losses = [
        sum(micro_batch_loss(model(inputs), targets, micro_batches=m) for inputs, targets in pipeline)
        for pipeline in batches
    ]
    total = torch.stack(pipeline_losses).mean()  # the average over replicas that the all-reduce computes
    total.backward()
    grads = {name: param.grad.detach().clone()  # a tied matrix under both its names
             for name, param in model.named_parameters(remove_duplicate=False)}
    return ReferenceStep(loss=total.item(), grads=grads)


def held_out_loss(model: StageModule, source: TokenSource, config: ModelConfig, *, n_pipelines: int) -> float:
    """What every pipeline measures on the held-out set (StageWorker's held-out loss), in one process: the mean of
    CE over the held-out micro-batches, summed in micro-batch order as the last stage sums them."""
    size = sequences_per_micro_batch(config, n_pipelines)
    total = 0.0
    with torch.no_grad():
        for m in range(config.micro_batches):
            inputs, targets = source.held_out_batch(micro_batch=m, micro_batch_size=size,
                                                    micro_batches=config.micro_batches, seq_len=config.seq_len)
            total += micro_batch_loss(model(inputs), targets, micro_batches=config.micro_batches).item()
    return total
