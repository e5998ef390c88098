"""What each codec does to the activation gradients a pipeline sends backward, on a model as training left it.

The activation gradients a stage sends its predecessor shrink as the loss falls; fp16, the old wire's codec (`model`),
keeps 2^-11 of relative precision only in its normal range (from 2^-14 up, protocol/codecs.py), and below that
rounds to a fixed step of 2^-24. The blockwise codecs scale each block by its largest magnitude, so they have no
such floor. This loads a saved model (a Hugging Face folder a run exported, such as benchmarks/compression.py's
`<logs>/run-scheduled/model`, or the seed's initial weights), cuts it into the stages of an even d_pp-way cut, and
backpropagates one micro-batch of a step's data (the CE / M each last stage backpropagates) through it once
with no codec and once per codec, each stage boundary's gradient sent through the codec's round trip. Per
boundary: the median magnitude, the share of values below fp16's normal range and the share fp16 rounds to zero, and
each codec's relative error (‖x̂ − x‖ / ‖x‖); per stage, the relative error of its blocks' parameter gradients,
which is what the optimizer sees. One process, one thread; seconds. Writes the "boundary-gradients" section of
benchmarks/RESULTS.md, or --section.

    python benchmarks/boundary_gradients.py --model small [--model-dir FOLDER] [--d-pp 4] [--step 0]
"""
from __future__ import annotations

import argparse
from pathlib import Path

import torch
from results import command_line, revision, write_section  # benchmarks/ is on sys.path when run as a script

from hetswarm.client.training.data import TokenSource, sequences_per_micro_batch
from hetswarm.client.training.hf_folder import load_stage_tensors
from hetswarm.client.training.model import build_full_model
from hetswarm.client.training.reference import micro_batch_loss
from hetswarm.protocol.codecs import round_trip
from hetswarm.protocol.model_config import get_model_config
from hetswarm.protocol.wire_format import Codec

CODECS: tuple[Codec, ...] = ("fp16", "8bit", "4bit")
FP16_NORMAL = 2.0 ** -14


class _Boundary(torch.autograd.Function):
    """The identity forward; backward, the gradient as the predecessor stage would receive it in `codec`, and the
    exact one kept in `seen`."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, codec: Codec | None, seen: list[torch.Tensor]) -> torch.Tensor:
        ctx.codec, ctx.seen = codec, seen
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        ctx.seen.append(grad.detach().clone())
        return (grad if ctx.codec is None else round_trip(grad, ctx.codec)), None, None


def backpropagate(model: torch.nn.Module, batch: tuple[torch.Tensor, torch.Tensor], cut_after: list[int],
                  micro_batches: int, codec: Codec | None) -> tuple[dict[str, torch.Tensor], list[torch.Tensor]]:
    """The parameter gradients of one micro-batch with each boundary's gradient through `codec` (None: exact), and
    the boundaries' exact gradients, first stage's boundary first."""
    seen: list[torch.Tensor] = []
    hooks = [model.blocks[str(layer)].register_forward_hook(lambda _m, _i, out: _Boundary.apply(out, codec, seen))
             for layer in cut_after]
    model.zero_grad()
    inputs, targets = batch
    micro_batch_loss(model(inputs), targets, micro_batches=micro_batches).backward()
    for hook in hooks:
        hook.remove()
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}, seen[::-1]


def _relative(approx: torch.Tensor, exact: torch.Tensor) -> float:
    return float((approx - exact).norm() / exact.norm())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="small", help="the model preset the folder holds (protocol/model_config.py)")
    parser.add_argument("--model-dir", type=Path, help="the exported folder to load; default: the initial weights")
    parser.add_argument("--d-pp", type=int, default=4)
    parser.add_argument("--pipelines", type=int, default=2, help="pipelines the batch is split over (its size)")
    parser.add_argument("--step", type=int, default=0, help="the step whose first micro-batch is backpropagated")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--section", default="boundary-gradients")
    args = parser.parse_args()
    torch.set_num_threads(1)
    config = get_model_config(args.model)
    model = build_full_model(config, seed=args.seed)
    if args.model_dir:
        load_stage_tensors(args.model_dir, model)
    stages = config.stage_layers(args.d_pp)
    cut_after = [b - 1 for _, b in stages[:-1]]
    batch = TokenSource.from_path(None, seed=args.seed).batch(
        step=args.step, pipeline=0, n_pipelines=args.pipelines, micro_batch=0,
        micro_batch_size=sequences_per_micro_batch(config, args.pipelines), seq_len=config.seq_len)
    exact, boundaries = backpropagate(model, batch, cut_after, config.micro_batches, None)
    through = {codec: backpropagate(model, batch, cut_after, config.micro_batches, codec)[0] for codec in CODECS}

    rows = []
    for index, grad in enumerate(boundaries):
        magnitude = grad.abs()
        below = float(((magnitude < FP16_NORMAL) & (magnitude > 0)).float().mean())
        flushed = float(((grad.half() == 0) & (grad != 0)).float().mean())
        errors = " | ".join(f"{_relative(round_trip(grad, codec), grad):.1e}" for codec in CODECS)
        rows.append(f"| stage {index + 1} → {index} | {float(magnitude.median()):.1e} | {below:.1%} | {flushed:.2%} | "
                    f"{errors} |")
    stage_rows = []
    for index, (first, end) in enumerate(stages):
        names = [name for name in exact if any(name.startswith(f"blocks.{layer}.") for layer in range(first, end))]
        errors = []
        for codec in CODECS:
            squared = sum(float(((through[codec][name] - exact[name]) ** 2).sum()) for name in names)
            errors.append(f"{(squared / sum(float((exact[name] ** 2).sum()) for name in names)) ** 0.5:.1e}")
        stage_rows.append(f"| stage {index} (layers {first}–{end - 1}) | {' | '.join(errors)} |")
    weights = f"`{args.model_dir}`" if args.model_dir else f"the initial weights of seed {args.seed}"
    markdown = f"""## Activation gradients at the stage boundaries: what each codec keeps of them

Command: `{command_line()}` at {revision()}, one process, one thread.

{config.name} model, {weights}, cut into {args.d_pp} even stages; the first micro-batch of step {args.step} (of
{args.pipelines} pipelines) backpropagated once exactly and once per codec at every boundary.

| boundary | median magnitude | below fp16's normal range | fp16 rounds to zero | {' | '.join(f'{c} error' for c in CODECS)} |
|---|---|---|---|{'---|' * len(CODECS)}
{chr(10).join(rows)}

Relative error of each stage's blocks' parameter gradients, every boundary through the codec:

| stage | {' | '.join(CODECS)} |
|---|{'---|' * len(CODECS)}
{chr(10).join(stage_rows)}
"""
    print(markdown)
    write_section(args.section, markdown)


if __name__ == "__main__":
    main()
