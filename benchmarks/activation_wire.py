"""What the activation wire costs in loss, and how far AQ-SGD's 4-bit deltas are from 8-bit activations, without a
network.

The swarm of benchmarks/compression.py's bandwidth-bound layout showed `aq-sgd` falling behind `8bit` as soon as its
4-bit activation deltas start and most while the loss falls steeply (RESULTS.md `compression-bandwidth-bound-300`):
a delta is small only while activations change slowly from one pass over the data to the next. This measures that
in one process. A model trains whole as R replicas (the plan's pipelines), cut into the d_pp stages of an even cut;
at every stage boundary, each replica's activation travels as the wire option sends it and its gradient comes back
through the option's gradient codec:

* a codec (`fp16`, `8bit`): the activation's round trip, both ways;
* `aq-sgd`: the project's own ends of a link (client/training/activation_deltas.py, a sender's and a receiver's
  DeltaBuffers with their checksums): the first pass whole in 8 bits, then 4-bit deltas; gradients in 8 bits;
* `adaptive:T`: as `aq-sgd`, but a frame whose 4-bit delta would leave more than T times the error of sending the
  activation whole in 8 bits is sent whole (its sender forgets the copy first, as after a refused delta);
* `bw4`: activations in 8 bits, gradients in 4; `aq-bw4`: `aq-sgd` with gradients in 4 bits (the pipeline wire of
  the `aq-powersgd` policy), `aq-bw4-stochastic` with them rounded as `bw4-stochastic`'s;
* `bw4-stochastic`: as `bw4`, the gradients rounded at random as the stages send 4-bit gradients
  (protocol/codecs.py): the received gradient's expectation is the gradient, where rounding to the nearest level
  sends each block's values below 1/14 of its largest as zero.

An option is `<wire>[+<all-reduce>]`: the replicas' gradients are averaged exactly (fp32), or by an all-reduce option
of benchmarks/gradient_options.py with its error feedback (`8bit+powersgd:0.25` is the `powersgd` policy's wire),
and applied by the stages' AdamW with the plan's learning-rate warm-up, every option from the same seed on the same
repeating data order. Per stretch of the run: the mean loss;
the activations' relative change since the sample's copy (‖a − m‖ / ‖a‖) and the relative error of what the
receiver trains on (‖â − a‖ / ‖a‖), over the frames after the first pass; for `aq-sgd`, the share of those frames
whose 4-bit delta is within T× of 8-bit whole's error for a few T (what `adaptive:T` would send as deltas); for
`adaptive:T`, the share it sent as deltas. One thread per option. Writes the "activation-wire" section of
benchmarks/RESULTS.md, or --section.

    python benchmarks/activation_wire.py --model small --data-period 25 --steps 300 \\
                                         --options fp16,8bit,aq-sgd,adaptive:2 [--jobs 2]
"""
from __future__ import annotations

import argparse
import itertools
import statistics
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from functools import partial

import torch
from gradient_options import Option, averaged_gradients, parse_option, seeded_training  # benchmarks/ is on sys.path
from results import command_line, revision, write_section

from hetswarm.client.training.activation_deltas import DeltaBuffers, Sample
from hetswarm.client.training.reference import step_batches
from hetswarm.protocol.codecs import decode_tensor, encode_tensor, round_trip
from hetswarm.protocol.model_config import ModelConfig, get_model_config
from hetswarm.protocol.wire_format import Codec

STRETCHES = 6
WIRES: dict[str, tuple[bool, str]] = {
    "fp16": (False, "fp16"), "8bit": (False, "8bit"), "aq-sgd": (True, "8bit"), "adaptive": (True, "8bit"),
    "bw4": (False, "4bit"), "bw4-stochastic": (False, "4bit at random"),
    "aq-bw4": (True, "4bit"), "aq-bw4-stochastic": (True, "4bit at random")}
"""Each wire option: whether it sends activation deltas, and how its gradients travel."""
TOLERANCES = (1.0, 2.0, 4.0)
"""The T of `adaptive:T` whose share of delta frames an `aq-sgd` run reports."""


def _relative(approx: torch.Tensor, exact: torch.Tensor) -> float:
    return float((approx - exact).norm() / exact.norm().clamp_min(1e-30))


@dataclass
class FrameStats:
    """What the frames of one step sent after the first pass: per frame, the activation's change since its copy,
    the received error, and 4-bit delta's error against 8-bit whole's."""

    change: list[float] = field(default_factory=list)
    error: list[float] = field(default_factory=list)
    ratio: list[float] = field(default_factory=list)
    deltas: int = 0


class Wire:
    """One option's stage boundaries: what a receiver gets for each activation, and the codec of gradients."""

    def __init__(self, option: str) -> None:
        name, _, tolerance = option.partition(":")
        if name not in WIRES:
            raise SystemExit(f"unknown wire {option!r}: {', '.join(WIRES)} (adaptive:T)")
        self.sends_deltas, gradients = WIRES[name]
        self.codec: Codec = "fp16" if name == "fp16" else "8bit"
        self.gradients: Callable[[torch.Tensor], torch.Tensor] = (
            partial(rounded_at_random, seeds=itertools.count()) if gradients == "4bit at random"
            else partial(round_trip, codec=gradients))
        self.tolerance = float(tolerance) if name == "adaptive" else None
        self.links: dict[tuple[int, int], tuple[DeltaBuffers, DeltaBuffers]] = {}
        self.copies: dict[tuple[int, int], dict[Sample, torch.Tensor]] = {}
        """Each link's copy of each sample, as both ends hold it (DeltaBuffers keeps its own to itself): what a delta
        would be taken against, for the frame statistics."""
        self.stats = FrameStats()

    def received(self, activation: torch.Tensor, *, link: tuple[int, int], step: int, sample: Sample) -> torch.Tensor:
        """What the next stage trains on for `activation` on `link` (boundary, replica)."""
        if not self.sends_deltas:
            return round_trip(activation, self.codec)
        sender, receiver = self.links.setdefault(link, (DeltaBuffers(whole="8bit", delta="4bit"),
                                                        DeltaBuffers(whole="8bit", delta="4bit")))
        copy = self.copies.setdefault(link, {}).get(sample)
        if copy is not None:
            whole_error = _relative(round_trip(activation, "8bit"), activation)
            delta_error = _relative(copy + round_trip(activation - copy, "4bit"), activation)
            ratio = delta_error / max(whole_error, 1e-30)
            self.stats.change.append(_relative(copy, activation))
            self.stats.ratio.append(ratio)
            if self.tolerance is not None and ratio > self.tolerance:
                sender.forget(sample)
        message, codec, base_crc = sender.outgoing(activation, attempt=(step, 0), sample=sample)
        got = receiver.incoming(decode_tensor(message, codec), attempt=(step, 0), sample=sample, base_crc=base_crc,
                                sender=f"link {link}")
        receiver.stage((step, 0), sample, got)
        if copy is not None:
            self.stats.error.append(_relative(got, activation))
            self.stats.deltas += base_crc is not None
        self.copies[link][sample] = got
        return got

    def commit(self, step: int) -> FrameStats:
        """Ends the step at both ends of every link; the step's frame statistics."""
        for sender, receiver in self.links.values():
            sender.commit((step, 0))
            receiver.commit((step, 0))
        stats, self.stats = self.stats, FrameStats()
        return stats


def rounded_at_random(tensor: torch.Tensor, *, seeds: Iterator[int]) -> torch.Tensor:
    """What a receiver gets for `tensor` sent in 4 bits rounded at random, as the stages send 4-bit gradients
    (protocol/codecs.py), each frame with the next of `seeds`."""
    return decode_tensor(encode_tensor(tensor, "4bit", rounding_seed=next(seeds)), "4bit")


class _Boundary(torch.autograd.Function):
    """Forward: what the receiver trains on; backward: the gradient as the sender receives it."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, received: torch.Tensor,
                gradients: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        ctx.gradients = gradients
        return received.clone()

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return ctx.gradients(grad), None, None


def parse(option: str) -> tuple[Wire, Option]:
    """`<wire>[+<all-reduce>]`: the boundaries' wire option and the replicas' averaging (benchmarks/gradient_options.py's
    options; exact by default)."""
    wire, _, allreduce = option.partition("+")
    return Wire(wire), parse_option(allreduce or "none")


@dataclass(frozen=True)
class Trained:
    """One option's run: its losses and frame statistics step by step."""

    option: str
    losses: list[float]
    frames: list[FrameStats]
    seconds: float


def train(option: str, model: ModelConfig, *, steps: int, replicas: int, d_pp: int) -> Trained:
    """Trains `model` from seed 0 with `option` at every stage boundary (module docstring)."""
    torch.set_num_threads(1)
    module, _, config, optimizer, data = seeded_training(model)
    wire, allreduce = parse(option)
    cut_after = [end - 1 for _, end in model.stage_layers(d_pp)[:-1]]
    where: dict[str, object] = {}

    def boundary(layer: int):
        def hook(_module, _inputs, output: torch.Tensor) -> torch.Tensor:
            received = wire.received(output.detach().to(torch.float32), link=(layer, where["replica"]),
                                     step=where["step"], sample=where["sample"])
            return _Boundary.apply(output, received, wire.gradients)
        return hook

    hooks = [module.blocks[str(layer)].register_forward_hook(boundary(layer)) for layer in cut_after]
    residuals = [[torch.zeros_like(p) for p in module.parameters()] for _ in range(replicas)]
    losses, frames, started = [], [], time.perf_counter()
    for step in range(steps):
        batches = step_batches(data, model, step=model.data_step(step), n_pipelines=replicas)

        def before(replica: int, micro_batch: int) -> None:
            where.update(replica=replica, step=step, sample=(model.data_step(step), micro_batch))

        loss, residuals = averaged_gradients(module, allreduce, residuals, batches, model=model, step=step,
                                             before_micro_batch=before)
        config.set_step_lr(optimizer, model, step)
        optimizer.step()
        losses.append(loss)
        frames.append(wire.commit(step))
        if (step + 1) % model.data_period == 0:
            start = step + 1 - model.data_period
            print(f"{option}, steps {start}–{step}: " + _cell(losses, frames, start, step + 1, option)
                  + f" ({(time.perf_counter() - started) / (step + 1):.1f} s a step so far)", flush=True)
    for hook in hooks:
        hook.remove()
    return Trained(option, losses, frames, time.perf_counter() - started)


def _cell(losses: list[float], frames: list[FrameStats], start: int, end: int, option: str,
          base: list[float] | None = None) -> str:
    """Steps [start, end): the mean loss (against `base`'s, if given); over the frames after the first pass, the
    median change and received error, and the share of deltas (`adaptive:T`) or of frames within each tolerance
    (`aq-sgd`)."""
    mean = statistics.fmean(losses[start:end])
    cell = f"{mean:.3f}" + (f" ({mean / statistics.fmean(base[start:end]) - 1:+.1%})" if base else "")
    frames = frames[start:end]
    change = [value for stats in frames for value in stats.change]
    if not change:
        return cell
    error = [value for stats in frames for value in stats.error]
    cell += f"; change {statistics.median(change):.3f}, error {statistics.median(error):.4f}"
    if option.startswith("adaptive"):
        cell += f", deltas {sum(stats.deltas for stats in frames) / len(change):.0%}"
    elif option == "aq-sgd":
        ratio = [value for stats in frames for value in stats.ratio]
        cell += ", within " + "/".join(f"{sum(r <= t for r in ratio) / len(ratio):.0%}" for t in TOLERANCES)
    return cell


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--options", default="fp16,8bit,aq-sgd,adaptive:2")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--d-pp", type=int, default=4)
    parser.add_argument("--model", default="small", help="model preset")
    parser.add_argument("--data-period", type=int, default=25, help="steps per pass over a repeating data order")
    parser.add_argument("--lr-warmup-steps", type=int, default=10)
    parser.add_argument("--jobs", type=int, default=1, help="options trained at once, one process each")
    parser.add_argument("--section", default="activation-wire", help="RESULTS.md section to write")
    args = parser.parse_args()
    model = get_model_config(args.model, data_period=args.data_period, lr_warmup_steps=args.lr_warmup_steps)
    options = args.options.split(",")
    for option in options:
        parse(option)  # refuses an unknown option before any training
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        runs = list(pool.map(partial(train, model=model, steps=args.steps, replicas=args.replicas, d_pp=args.d_pp),
                             options))
    base = runs[0]
    edges = [i * (args.steps // STRETCHES) for i in range(STRETCHES)] + [args.steps]
    rows = [f"| {start}–{end - 1} | " + " | ".join(_cell(run.losses, run.frames, start, end, run.option, None if run is base else base.losses)
                                      for run in runs)
            + " |" for start, end in zip(edges, edges[1:])]
    finals = " | ".join(f"{statistics.fmean(run.losses[-20:]):.4f}" for run in runs)
    markdown = f"""## The activation wire: loss, and 4-bit deltas against 8-bit activations, without a network

Command: `{command_line()}` at {revision()}, one thread per option ({', '.join(f'{run.option} {run.seconds / 60:.0f} min' for run in runs)}).

The {args.model} model as {args.replicas} replicas in one process, cut into {args.d_pp} even stages, {args.steps}
steps from the same seed on a data order repeating every {args.data_period} steps, the stages' AdamW with the
learning rate warming up over {args.lr_warmup_steps} steps; at each boundary the wire option (the script's
docstring). Each cell: the stretch's mean loss (against `{options[0]}`); over its frames after the first pass, the
median relative change of an activation since its copy and the median relative error of what the receiver trains on;
for `aq-sgd`, the share of frames whose 4-bit delta is within {'/'.join(f'{t:g}' for t in TOLERANCES)}× the error of
8-bit whole; for `adaptive:T`, the share it sent as deltas.

| steps | {' | '.join(options)} |
|---|{'---|' * len(options)}
{chr(10).join(rows)}
| last 20 | {finals} |
"""
    print(markdown)
    write_section(args.section, markdown)


if __name__ == "__main__":
    main()
