"""What each gradient option of the stage-group all-reduce costs in loss, for the bytes it saves, without a network.

A model (the tiny one by default) trains whole in this process as R replicas (the data-parallel pipelines of a
plan; the demo has 2), each on its own micro-batches of every step, with the stages' AdamW and, with
--lr-warmup-steps, the plan's learning-rate warm-up. Their gradients are averaged as a stage group
does, by the project's own code for each option: the 8-bit codec's round trip of what each member sends and of the
average a reducer sends back (protocol/codecs.py), the sample a sparse all-reduce draws (gradient_sample.py), the
low-rank factors of PowerSGD (low_rank.py), and error feedback of all a round did not deliver (a member's residual
is what its values lost, plus the reducer's loss of the average; over the members they sum to what the group did
not apply, as in group_allreduce.py). Every option trains from the same seed on the same data. What it leaves out:
the network, so no timing; compression.py measures that on a real swarm.

Reports, per option and warm-up: the all-reduce's bytes per step against fp32's, the highest loss of a step and the
loss early on and over the last 20 steps (a spike in the first steps can stall training long after it: the second
command shows it on the model and data order of compression.py's bandwidth-bound layout). Writes the
"gradient-options" section of benchmarks/RESULTS.md, or --section.

    python benchmarks/gradient_options.py [--options none,8bit,sparse,powersgd:0.125,powersgd:0.25,powersgd:0.5]
                                          [--steps 300] [--replicas 2] [--section gradient-options]
    python benchmarks/gradient_options.py --model small --data-period 25 --steps 100 --options none,powersgd:0.25 \
                                          --lr-warmup-steps 0,10 --section lr-warmup
"""
from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from results import command_line, revision, write_section  # benchmarks/ is on sys.path when run as a script

from hetswarm.client.training.data import TokenSource
from hetswarm.client.training.gradient_sample import GradientSample, flatten, unflatten
from hetswarm.client.training.low_rank import LowRankStep
from hetswarm.client.training.model import build_full_model
from hetswarm.client.training.reference import micro_batch_loss, step_batches
from hetswarm.client.training.stage_worker import StageConfig
from hetswarm.protocol.codecs import round_trip
from hetswarm.protocol.model_config import ModelConfig, get_model_config
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


@dataclass(frozen=True)
class Trained:
    """One option's run: its losses step by step, and its all-reduce's bytes per step against fp32's."""

    losses: list[float]
    share: float
    seconds: float

    @property
    def final(self) -> float:
        """The mean of the last LOSS_WINDOW steps' losses."""
        return statistics.fmean(self.losses[-LOSS_WINDOW:])

    def mean(self, start: int, stop: int) -> float:
        return statistics.fmean(self.losses[start:stop])


def seeded_training(model: ModelConfig
                    ) -> tuple[torch.nn.Module, list[torch.nn.Parameter], StageConfig, torch.optim.Optimizer, TokenSource]:
    """What every in-process run starts from: `model` built from seed 0, its parameters, the stages' AdamW over
    them, and the data source of seed 0 (benchmarks/activation_wire.py starts from the same)."""
    torch.manual_seed(0)
    module = build_full_model(model, seed=0)
    parameters = list(module.parameters())
    config = StageConfig()
    return module, parameters, config, config.build_optimizer(parameters), TokenSource.from_path(None, seed=0)


def averaged_gradients(module: torch.nn.Module, option: Option, residuals: list[list[torch.Tensor]],
                       batches: list[list[tuple[torch.Tensor, torch.Tensor]]], *, model: ModelConfig, step: int,
                       before_micro_batch: Callable[[int, int], None] | None = None
                       ) -> tuple[float, list[list[torch.Tensor]]]:
    """One step of R replicas (`batches`: each one's micro-batches): each one's gradient, its residual added,
    averaged by `option` into the parameters' gradients. The step's loss and the replicas' new residuals;
    `before_micro_batch(replica, micro_batch)` is told which one runs next."""
    parameters, members, loss = list(module.parameters()), [], 0.0
    for replica, micro_batches in enumerate(batches):
        for parameter in parameters:
            parameter.grad = None
        for micro_batch, (inputs, targets) in enumerate(micro_batches):
            if before_micro_batch is not None:
                before_micro_batch(replica, micro_batch)
            part = micro_batch_loss(module(inputs), targets, micro_batches=model.micro_batches)
            part.backward()
            loss += part.item() / len(batches)
        members.append([p.grad + r for p, r in zip(parameters, residuals[replica])])
    averages, residuals = option.average(members, step)
    for parameter, average in zip(parameters, averages):
        parameter.grad = average.clone()
    return loss, residuals


def train(option: Option, model: ModelConfig, *, steps: int, replicas: int) -> Trained:
    """Trains `model` from seed 0 with `option` averaging its replicas' gradients, with the plan's learning-rate
    warm-up as the stages apply it (StageConfig.set_step_lr)."""
    module, parameters, config, optimizer, data = seeded_training(model)
    residuals = [[torch.zeros_like(p) for p in parameters] for _ in range(replicas)]
    losses, started = [], time.perf_counter()
    for step in range(steps):
        batches = step_batches(data, model, step=model.data_step(step), n_pipelines=replicas)
        loss, residuals = averaged_gradients(module, option, residuals, batches, model=model, step=step)
        config.set_step_lr(optimizer, model, step)
        optimizer.step()
        losses.append(loss)
    whole = sum(p.numel() for p in parameters) * BYTES_PER_VALUE["fp32"]
    return Trained(losses, option.values_sent * BYTES_PER_VALUE[option.codec] / whole, time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--options", default="none,8bit,sparse,powersgd:0.125,powersgd:0.25,powersgd:0.5")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--model", default="tiny", help="model preset")
    parser.add_argument("--data-period", type=int, help="steps per pass over a repeating data order")
    parser.add_argument("--lr-warmup-steps", default="0", help="comma-separated warm-ups: each option trains with "
                                                              "each (ModelConfig.lr_warmup_steps)")
    parser.add_argument("--section", default="gradient-options", help="RESULTS.md section to write")
    args = parser.parse_args()
    torch.set_num_threads(1)
    warmups = [int(text) for text in args.lr_warmup_steps.split(",")]
    texts = args.options.split(",")
    early = (min(20, args.steps // 2), min(50, args.steps))
    rows, baseline = [], None
    for warmup in warmups:
        model = get_model_config(args.model, data_period=args.data_period, lr_warmup_steps=warmup)
        for text in texts:
            option = parse_option(text)
            run = train(option, model, steps=args.steps, replicas=args.replicas)
            baseline = run.final if baseline is None else baseline
            peak = max(range(args.steps), key=run.losses.__getitem__)
            rows.append(f"| {text} | {warmup} | {option.codec} | {run.share:.4f} ({1 / run.share:.1f}× fewer) | "
                        f"{run.losses[peak]:.2f} (step {peak}) | {run.mean(*early):.4f} | {run.final:.4f} | "
                        f"{100 * (run.final / baseline - 1):+.1f}% |")
            print(rows[-1], f"{run.seconds:.0f} s", flush=True)
    first = f"{texts[0]}, warm-up {warmups[0]}"
    period = f", a data order repeating every {args.data_period} steps" if args.data_period else ""
    write_section(args.section, f"""## Gradient options of the all-reduce: loss for bytes, without a network

Command: `{command_line()}` at {revision()}.

The {args.model} model as {args.replicas} replicas in one process, {args.steps} steps from the same seed on the
same data{period}, the stages' AdamW (lr {StageConfig().lr}), its learning rate warming up linearly over the
warm-up's steps; each option averages the replicas' gradients with the project's code for it, error feedback
included (the script's docstring). Bytes: what one member's all-reduce sends per step (both rounds of a low-rank
one), against fp32's. Loss: the highest step's; the mean of steps {early[0]}–{early[1] - 1}; the mean of the last
{LOSS_WINDOW} steps, and its change against `{first}`.

| option | warm-up (steps) | codec | bytes per step vs fp32 | peak loss | loss, steps {early[0]}–{early[1] - 1} | loss, last {LOSS_WINDOW} | vs {first} |
|---|---|---|---|---|---|---|---|
""" + "\n".join(rows))


if __name__ == "__main__":
    main()
