"""Train the `tiny` model as two pipeline stages by hand, and check every step against the single-process model.

This is what a two-stage pipeline of the swarm does, with the network taken out: stage 0 (embeddings and the
first half of the layers) sends its activations to stage 1 (the other half and the head), stage 1 computes the
loss and sends the gradient of that loss with respect to the activations back, and each stage steps its own
optimizer. GPipe order: all forwards of a step's micro-batches, then their backwards in reverse. Because the
stages are initialised from per-module seeds (hetswarm.client.training.model), the pair equals the whole model
built with the same seed, so the loss and every gradient must match `reference_step` up to fp32 rounding.

    python examples/train_two_stages.py --steps 3

Exits with status 1 if the largest difference exceeds --tolerance (1e-5 by default).
"""
from __future__ import annotations

import argparse
import sys

import torch

from hetswarm.client.training.data import TokenSource
from hetswarm.client.training.model import StageModule, build_full_model, build_stage
from hetswarm.client.training.reference import MicroBatch, micro_batch_loss, reference_step, step_batches
from hetswarm.protocol.model_config import get_model_config

D_PP = 2


def gpipe_step(first: StageModule, last: StageModule, micro_batches: list[MicroBatch]) -> float:
    """One pipeline step over two stages; returns the step's loss (the mean of the micro-batches' losses).

    Only detached tensors cross the stage boundary, as they would cross the network: stage 1 gets a leaf that
    requires grad, and after its backward that leaf's `.grad` is what travels back to stage 0.
    """
    sent, received, losses = [], [], []
    for inputs, targets in micro_batches:  # forwards, in order
        activations = first(inputs)  # (B, T, C), stays in stage 0's graph
        boundary = activations.detach().requires_grad_()  # what stage 1 receives
        losses.append(micro_batch_loss(last(boundary), targets, micro_batches=len(micro_batches)))
        sent.append(activations)
        received.append(boundary)
    for m in reversed(range(len(micro_batches))):  # backwards, last micro-batch first
        losses[m].backward()  # stage 1: gradients of its parameters, and of its input
        sent[m].backward(received[m].grad)  # stage 0: continue from the gradient stage 1 sent back
    return sum(loss.item() for loss in losses)


def max_grad_difference(stages: list[StageModule], reference_grads: dict[str, torch.Tensor]) -> float:
    """Largest |stage gradient − reference gradient| over every parameter; parameter names are global."""
    names = [name for stage in stages for name, _ in stage.named_parameters()]
    if sorted(names) != sorted(reference_grads):
        raise RuntimeError("the two stages do not hold exactly the parameters of the whole model")
    return max((param.grad - reference_grads[name]).abs().max().item()
               for stage in stages for name, param in stage.named_parameters())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3, help="optimizer steps to run and compare")
    parser.add_argument("--seed", type=int, default=0, help="model seed (the same for the stages and the reference)")
    parser.add_argument("--lr", type=float, default=3e-3, help="AdamW learning rate, on both sides")
    parser.add_argument("--tolerance", type=float, default=1e-5, help="largest allowed difference (fp32)")
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error(f"--steps must be at least 1, got {args.steps}")

    torch.set_num_threads(1)  # deterministic reductions and a fair share of a small machine
    torch.manual_seed(args.seed)
    config = get_model_config("tiny")
    source = TokenSource.from_path(None)  # the built-in corpus: nothing to download
    full = build_full_model(config, seed=args.seed)
    stages = [build_stage(config, stage, D_PP, seed=args.seed) for stage in range(D_PP)]
    print(f"tiny model: {config.n_layers} layers, stages hold layers {config.stage_layers(D_PP)}; "
          f"{config.micro_batches} micro-batches per step")

    # The same optimizer on both sides: the stages' two optimizers together see exactly the reference's parameters.
    def adamw(params) -> torch.optim.AdamW:
        return torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)

    reference_optimizer = adamw(full.parameters())
    stage_optimizers = [adamw(stage.parameters()) for stage in stages]

    worst = 0.0
    for step in range(args.steps):
        (micro_batches,) = step_batches(source, config, step=step, n_pipelines=1)
        reference = reference_step(full, [micro_batches])  # leaves ∇L in full's .grad too
        for stage in stages:
            stage.zero_grad(set_to_none=True)
        pipeline_loss = gpipe_step(stages[0], stages[1], micro_batches)

        loss_diff = abs(pipeline_loss - reference.loss)
        grad_diff = max_grad_difference(stages, reference.grads)
        worst = max(worst, loss_diff, grad_diff)
        print(f"step {step}: loss {pipeline_loss:.6f} (reference {reference.loss:.6f}), "
              f"|Δloss| {loss_diff:.2e}, max |Δgrad| {grad_diff:.2e}")

        reference_optimizer.step()
        for optimizer in stage_optimizers:
            optimizer.step()

    verdict = "OK" if worst <= args.tolerance else "FAILED"
    print(f"max abs difference {worst:.3e} (tolerance {args.tolerance:.0e}): {verdict}")
    return 0 if worst <= args.tolerance else 1


if __name__ == "__main__":
    sys.exit(main())
