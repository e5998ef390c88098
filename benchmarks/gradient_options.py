"""What each gradient option of the stage-group all-reduce costs in loss, for the bytes it saves, without a network.

The tiny model trains whole in this process as R replicas (the data-parallel pipelines of a plan; the demo has 2),
each on its own micro-batches of every step, with the stages' AdamW. Their gradients are averaged as a stage group
does, by the project's own code for each option: the 8-bit codec's round trip of what each member sends and of the
average a reducer sends back (protocol/codecs.py), the sample a sparse all-reduce draws (gradient_sample.py), the
low-rank factors of PowerSGD (low_rank.py), and error feedback of all a round did not deliver (a member's residual
is what its values lost, plus the reducer's loss of the average; over the members they sum to what the group did
not apply, as in group_allreduce.py). Every option trains from the same seed on the same data. What it leaves out:
the network, so no timing; compression.py measures that on a real swarm.

Reports, per option: the all-reduce's bytes per step against fp32's, and the loss, the mean of the last 20 steps'.
Writes the "gradient-options" section of benchmarks/RESULTS.md.

    python benchmarks/gradient_options.py [--options none,8bit,sparse,powersgd:0.125,powersgd:0.25,powersgd:0.5]
                                          [--steps 300] [--replicas 2] [--section gradient-options]
"""
from __future__ import annotations

import argparse
import time
from collections.abc import Sequence

import torch
from results import command_line, revision, write_section  # benchmarks/ is on sys.path when run as a script

from hetswarm.client.training.data import TokenSource
from hetswarm.client.training.gradient_sample import GradientSample, flatten, unflatten
from hetswarm.client.training.low_rank import LowRankStep
from hetswarm.client.training.model import build_full_model
from hetswarm.client.training.reference import micro_batch_loss, step_batches
from hetswarm.client.training.stage_worker import StageConfig
from hetswarm.protocol.codecs import round_trip
from hetswarm.protocol.model_config import get_model_config
from hetswarm.protocol.wire_format import BYTES_PER_VALUE, LOW_RANK_SHARE, SPARSE_DENSITY, Codec

LOSS_WINDOW = 20
ROUND_TAG = "gradient-options/v1/stage0"


def averaged(values: Sequence[torch.Tensor], codec: Codec) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """One round of the members' flat `values` in `codec`: the average every member applies, and each member's
    error (what its values lost on the way, plus the reducer's loss of the average)."""
    decoded = [round_trip(value, codec) for value in values]
    mean = torch.stack(decoded).double().mean(0).float()
    average = round_trip(mean, codec)
    return average, [value - got + (mean - average) for value, got in zip(values, decoded)]


class Option:
    """An all-reduce option: each member's tensors (residual added) → the averages and each member's residual."""

    def __init__(self, name: str, codec: Codec, *, density: float | None = None, share: float | None = None) -> None:
        self.name, self.codec, self.density, self.share = name, codec, density, share
        self.q: dict[int, torch.Tensor] = {}
        self.values_sent = 0

    def average(self, members: list[list[torch.Tensor]], step: int
                ) -> tuple[list[torch.Tensor], list[list[torch.Tensor]]]:
        if self.share is not None:
            return self._low_rank(members)
        flats = [flatten(tensors) for tensors in members]
        if self.density is None:
            self.values_sent = flats[0].numel()
            average, errors = averaged(flats, self.codec)
            return unflatten(average, members[0]), [unflatten(error, members[0]) for error in errors]
        sample = GradientSample(flats[0].numel(), density=self.density, round_tag=ROUND_TAG, step=step)
        average, errors = averaged([sample.gather(flat) for flat in flats], self.codec)
        self.values_sent = average.numel()
        return (unflatten(sample.scatter(average, into=torch.zeros(sample.numel)), members[0]),
                [unflatten(sample.scatter(error, into=flat), members[0]) for error, flat in zip(errors, flats)])

    def _low_rank(self, members: list[list[torch.Tensor]]) -> tuple[list[torch.Tensor], list[list[torch.Tensor]]]:
        steps = [LowRankStep(tensors, share=self.share, round_tag=ROUND_TAG,
                             carried=lambda index, shape: self.q.get(index)) for tensors in members]
        first = [step.first_round() for step in steps]
        first_average, first_errors = averaged([flatten(sent) for sent in first], self.codec)
        first_averages = unflatten(first_average, first[0])
        second = [step.second_round(first_averages) for step in steps]
        q_average, q_errors = averaged([flatten(sent) for sent in second], self.codec)
        q_averages = unflatten(q_average, second[0])
        self.q = dict(zip(steps[0].factored, q_averages))
        self.values_sent = first_average.numel() + q_average.numel()
        return (steps[0].averages(first_averages, q_averages),
                [step.residuals(unflatten(first_error, sent), unflatten(q_error, sent_q))
                 for step, first_error, q_error, sent, sent_q in zip(steps, first_errors, q_errors, first, second)])


def parse_option(text: str) -> Option:
    """`none`, `8bit`, `sparse[:density]` or `powersgd[:share]` (the sparse and powersgd policies send 8-bit)."""
    name, _, value = text.partition(":")
    if name in ("none", "8bit"):
        return Option(text, "fp32" if name == "none" else "8bit")
    if name == "sparse":
        return Option(text, "8bit", density=float(value or SPARSE_DENSITY))
    if name == "powersgd":
        return Option(text, "8bit", share=float(value or LOW_RANK_SHARE))
    raise SystemExit(f"unknown option {text!r}: none, 8bit, sparse[:density] or powersgd[:share]")


def train(option: Option, *, steps: int, replicas: int) -> tuple[float, float, float]:
    """The option's loss (mean of the last LOSS_WINDOW steps), its all-reduce's bytes per step against fp32's, and
    the seconds it took."""
    model = get_model_config("tiny")
    torch.manual_seed(0)
    module = build_full_model(model, seed=0)
    parameters = list(module.parameters())
    optimizer = StageConfig().build_optimizer(parameters)
    data = TokenSource.from_path(None, seed=0)
    residuals = [[torch.zeros_like(p) for p in parameters] for _ in range(replicas)]
    losses, started = [], time.perf_counter()
    for step in range(steps):
        members, loss = [], 0.0
        for pipeline, micro_batches in enumerate(step_batches(data, model, step=step, n_pipelines=replicas)):
            optimizer.zero_grad(set_to_none=True)
            for inputs, targets in micro_batches:
                part = micro_batch_loss(module(inputs), targets, micro_batches=model.micro_batches)
                part.backward()
                loss += part.item() / replicas
            members.append([p.grad + r for p, r in zip(parameters, residuals[pipeline])])
        averages, residuals = option.average(members, step)
        for parameter, average in zip(parameters, averages):
            parameter.grad = average.clone()
        optimizer.step()
        losses.append(loss)
    whole = sum(p.numel() for p in parameters) * BYTES_PER_VALUE["fp32"]
    return (sum(losses[-LOSS_WINDOW:]) / LOSS_WINDOW, option.values_sent * BYTES_PER_VALUE[option.codec] / whole,
            time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--options", default="none,8bit,sparse,powersgd:0.125,powersgd:0.25,powersgd:0.5")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--section", default="gradient-options", help="RESULTS.md section to write")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows, baseline = [], None
    for text in args.options.split(","):
        option = parse_option(text)
        loss, share, seconds = train(option, steps=args.steps, replicas=args.replicas)
        baseline = loss if baseline is None else baseline
        rows.append(f"| {text} | {option.codec} | {share:.4f} ({1 / share:.1f}× fewer) | {loss:.4f} | "
                    f"{100 * (loss / baseline - 1):+.1f}% |")
        print(rows[-1], f"{seconds:.0f} s", flush=True)
    first = args.options.split(",")[0]
    write_section(args.section, f"""## Gradient options of the all-reduce: loss for bytes, without a network

Command: `{command_line()}` at {revision()}.

The tiny model as {args.replicas} replicas in one process, {args.steps} steps from the same seed on the same data,
the stages' AdamW; each option averages the replicas' gradients with the project's code for it, error feedback
included (the script's docstring). Bytes: what one member's all-reduce sends per step (both rounds of a low-rank
one), against fp32's. Loss: mean of the last {LOSS_WINDOW} steps; change against `{first}`.

| option | codec | bytes per step vs fp32 | loss | loss vs {first} |
|---|---|---|---|---|
""" + "\n".join(rows))


if __name__ == "__main__":
    main()
