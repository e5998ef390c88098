"""Fewer bytes on slow links: step time and loss of the demo's swarm under each compression policy.

The demo's swarm (a coordinator and 8 clients, two per world-wide region, links emulated from the DT-FM world-wide
scenario with bandwidths × 0.005; tiny model, 2 pipelines × 4 stages) trains the scheduled plan from the same seed on
the same data once per policy of `hetswarm coordinator --compression` (protocol/wire_format.py), each on a fresh
swarm of the same identities and sites. Measured step time: the median over peers of the step period after the
warm-up (hetswarm.client.local.demo); predicted: the coordinator's live model, which prices the bytes of the chosen
codecs. Loss: the mean of the last stages' losses over the last 20 steps, compared at the same step count, and over
six stretches of the run, with the held-out loss (`_curve`). Writes the "compression" section of benchmarks/RESULTS.md.

With --data-period P, the data order repeats every P steps (a corpus of P steps' micro-batches) and the policies
(by default today's wire and aq-sgd) train --passes passes over it; the first pass is the warm-up, so the step time
is measured from the second pass on, where AQ-SGD sends activation deltas. Writes the "activation-deltas" section.

    python benchmarks/compression.py [--steps 300] [--policies model,none,fp16,8bit]
    python benchmarks/compression.py --data-period 100 --passes 3 [--policies model,aq-sgd]
    python benchmarks/compression.py --policies model,8bit,sparse --bandwidth-scale 0.002 --section compression-sparse
    python benchmarks/compression.py --layout bandwidth-bound [--steps 300] [--policies model,8bit,powersgd]
    python benchmarks/compression.py --layout bandwidth-bound --data-period 25 --passes 12 --keep DIR [--policies …]

`--layout bandwidth-bound` trains the `small` model (6.5 M parameters) instead of the tiny one, with bandwidths
scaled so that the bytes of the wire before compression make most of the step, every client's compute pinned to a
fixed speed the live model prices, and the learning rate warming up over 10 steps (LAYOUTS): right after the first
policy's plan has trained, it prints what share of that plan's predicted step its transfers' bytes take, and stops
there if that is below BANDWIDTH_BOUND_SHARE, before the other policies train.

`--keep DIR` saves each policy's result in DIR/POLICY.json with the settings and the code it ran on, and reuses a
saved one instead of training again when both match (the swarm's packages unchanged since, `swarm_code`): one
table can then gather policies trained in turns, when all of them in a row take longer than one sitting.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from results import command_line, revision, write_section  # benchmarks/ is on sys.path when run as a script

from hetswarm.client.local.demo import DemoConfig, PhaseResult, run_swarm
from hetswarm.coordinator.scheduling.cost_model import PaperCostModel, Payloads
from hetswarm.coordinator.scheduling.plan import cost_plan
from hetswarm.protocol.model_config import get_model_config
from hetswarm.protocol.network import Network

BASELINE = "model"
"""Today's wire before compression: fp16 activations and gradients, fp32 all-reduce (the model config's widths)."""
LOSS_WINDOW = 20


@dataclass(frozen=True)
class Layout:
    """A swarm to measure the wire on."""

    model: str
    """The model preset (protocol/model_config.py)."""
    bandwidth_scale: float
    """Every emulated bandwidth × this, unless --bandwidth-scale says otherwise."""
    tflops: float | None = None
    """Every client computes as slowly as a device of this many TFLOPS (`hetswarm join --emulate-tflops`), below
    what each of the 8 reaches on this machine's 2 cores, so that the live model prices the compute they do; None:
    as fast as they can, priced by the machine's cached throughput."""
    lr_warmup_steps: int = 0
    """The plan's learning-rate warm-up (`hetswarm coordinator --lr-warmup-steps`): without one, the `small` model's
    loss spiked at step 6 on every wire and stalled for 100 steps after it under powersgd (RESULTS.md `lr-warmup`)."""

    @property
    def emulate_tflops(self) -> tuple[float, ...]:
        """DemoConfig.emulate_tflops for this layout."""
        return (self.tflops,) if self.tflops else ()


LAYOUTS = {"demo": Layout("tiny", 0.005), "bandwidth-bound": Layout("small", 0.01, tflops=0.04, lr_warmup_steps=10)}
BANDWIDTH_BOUND_SHARE = 0.6
"""The least share of the first policy's predicted step its transfers' bytes take in the bandwidth-bound layout."""


def use_a_fresh_throughput_cache(layout: Layout) -> None:
    """For a layout that pins the compute: points this process and the clients it starts at an empty throughput
    cache (XDG_CACHE_HOME), so that run_swarm measures this machine before any client runs, whatever an earlier,
    loaded measurement left in the user's cache (0.019 TFLOPS against 0.40 quiet on the 2-core machine): the pinned
    speed must be below the measured one."""
    if layout.tflops is not None:
        os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="hetswarm-cache-")


def copy_identities(keys: Path, into: Path) -> None:
    """The peers' keys of one swarm, for the next policy's: not the coordinator's remembered version and step
    (`<key>.state.json`, coordinator/run_state.py), so that every policy's coordinator starts afresh, as the first
    one's did."""
    shutil.copytree(keys, into, ignore=shutil.ignore_patterns("*.state.json"))


def _final_loss(phase: PhaseResult) -> float:
    steps = sorted(phase.losses)[-LOSS_WINDOW:]
    return statistics.fmean(phase.losses[step] for step in steps)


CURVE_STRETCHES = 6
"""The loss-over-the-run table splits the steps into this many stretches of equal length (the last takes the rest)."""


def _curve(results: dict[str, PhaseResult], baseline: str) -> str:
    """Each policy's loss over stretches of the run, against the baseline's over the same steps: a policy that ends
    above the baseline may have been behind all along or only at the end (the final-loss column cannot tell)."""
    last = max(max(phase.losses) for phase in results.values()) + 1
    length = last // CURVE_STRETCHES
    edges = [i * length for i in range(CURVE_STRETCHES)] + [last]  # the last stretch takes the remainder
    base = results[baseline]
    rows = []
    for start, end in zip(edges, edges[1:]):
        cells = [_stretch(phase, None if phase is base else base, start, end) for phase in results.values()]
        rows.append(f"| {start}–{end - 1} | " + " | ".join(cells) + " |")
    return (f"\nLoss over the run: each stretch's mean training loss (against `{baseline}` over the same steps); "
            f"after the semicolon, the held-out loss at the stretch's last evaluation.\n\n"
            f"| steps | {' | '.join(results)} |\n|---|{'---|' * len(results)}\n" + "\n".join(rows) + "\n")


def _stretch(phase: PhaseResult, base: PhaseResult | None, start: int, end: int) -> str:
    """One table cell: the mean training loss over steps [start, end) and the last held-out loss among them, each
    against `base`'s (none for the baseline itself)."""
    mean = _mean_over(phase.losses, start, end)
    cell = f"{mean:.3f}" + (f" ({mean / _mean_over(base.losses, start, end) - 1:+.1%})" if base else "")
    held = max((step for step in phase.held_out if start <= step < end), default=None)
    if held is None:
        return cell
    cell += f"; {phase.held_out[held]:.3f}"
    if base and held in base.held_out:
        cell += f" ({phase.held_out[held] / base.held_out[held] - 1:+.1%})"
    return cell


def _mean_over(losses: dict[int, float], start: int, end: int) -> float:
    return statistics.fmean(loss for step, loss in losses.items() if start <= step < end)


def bytes_free_floor(plan_path: Path) -> float:
    """The live model's step time for a saved plan's placement if no transfer carried any bytes: its latencies alone
    (the pipeline's hops each way, the all-reduce's exchanges, the commit vote) and its compute. No codec makes a
    step on that placement faster than this."""
    plan = json.loads(plan_path.read_text())
    grid = np.asarray(plan["stages"])  # (d_pp, d_dp) device ids
    d_pp, d_dp = grid.shape
    weightless = Payloads(dp_bytes=1e-12, pp_bytes=1e-12)
    free = cost_plan(PaperCostModel(Network.from_scenario(plan), weightless, d_dp=d_dp, d_pp=d_pp), grid)
    live = plan["breakdown"]
    return free.breakdown.total_s + live["compute_s"] + live["bubble_s"] + live["commit_s"]


TARGETS = {"8bit": (1.6, 0.02), "aq-sgd": (2.0, 0.03), "sparse": (2.5, 0.03), "powersgd": (2.5, 0.03),
           "aq-powersgd": (2.5, 0.03)}
"""The issue's targets against the wire before compression: speed-up per step, and loss change at most (a gradient
option's 2.5× for `aq-powersgd`, which adds activation deltas to one)."""


def _targets(results: dict[str, PhaseResult], baseline: str, floor: float) -> str:
    """The issue's targets for each policy that has one, against the wire before compression; with the share of the
    possible gain its speed reached (possible: the baseline's predicted step against every byte free, `floor`, on
    the same placement) and its held-out loss at the last evaluation."""
    lines = []
    base = results[baseline]
    possible = base.predicted_step_s - floor
    for policy, (speedup, loss_change) in TARGETS.items():
        if policy not in results or policy == baseline:
            continue
        phase = results[policy]
        saved = base.measured_step_s - phase.measured_step_s
        lines.append(f"Targets ({policy} against `{baseline}`): ≥ {speedup}× faster per step — measured "
                     f"{base.measured_step_s / phase.measured_step_s:.2f}×, {saved:.2f} s of the {possible:.2f} s "
                     f"every byte free would save ({saved / possible:.0%}); loss within {loss_change:.0%} — "
                     f"{_final_loss(phase) / _final_loss(base) - 1:+.2%} (held-out {_held_out_change(phase, base)}); "
                     f"prediction within 15 % — {phase.error:+.0%}.")
    return "\n" + "\n".join(lines) + "\n" if lines else ""


def _held_out_change(phase: PhaseResult, base: PhaseResult) -> str:
    """The held-out loss at the last step both evaluated, against the baseline's."""
    step = max(set(phase.held_out) & set(base.held_out), default=None)
    return "none" if step is None else f"{phase.held_out[step] / base.held_out[step] - 1:+.2%} at step {step}"


def _floor(floor: float, base: PhaseResult) -> str:
    return (f"With every byte free, the live model predicts {floor:.3f} s per step on the placement of the first "
            f"policy (latency and compute alone): no codec can be more than {base.predicted_step_s / floor:.2f}× "
            f"faster than its predicted {base.predicted_step_s:.3f} s there, of which transfers' bytes are "
            f"{1 - floor / base.predicted_step_s:.0%}.\n")


SWARM_CODE = ("client", "coordinator", "protocol", "pyproject.toml")
"""What a swarm runs: a kept result is reused only while these are as they were when it trained."""


def swarm_code() -> str | None:
    """The git objects of SWARM_CODE at HEAD; None where the checkout changes them (a result of uncommitted code
    can be neither named nor matched later)."""
    root = Path(__file__).resolve().parent.parent
    git = ["git", "-C", str(root)]
    if subprocess.run([*git, "status", "--porcelain", "--", *SWARM_CODE], capture_output=True, text=True,
                      check=True).stdout.strip():
        return None
    return " ".join(subprocess.run([*git, "rev-parse", *(f"HEAD:{path}" for path in SWARM_CODE)],
                                   capture_output=True, text=True, check=True).stdout.split())


@dataclass(frozen=True)
class KeptResult:
    """One policy's run as --keep saves it."""

    settings: dict
    """What must match for a later run to reuse it: the layout, seed, data order and step counts."""
    code: str
    """swarm_code() when it trained."""
    revision: str
    phase: PhaseResult
    floor_s: float
    """bytes_free_floor of its plan."""

    def save(self, path: Path) -> None:
        fields = dataclasses.asdict(self)
        fields["phase"]["exported"] = None
        path.write_text(json.dumps(fields, indent=1) + "\n")

    @classmethod
    def load(cls, path: Path) -> KeptResult:
        fields = json.loads(path.read_text())
        phase = fields.pop("phase")
        for name in ("losses", "loss_times", "held_out"):  # JSON keys are strings; steps are ints
            phase[name] = {int(step): value for step, value in phase[name].items()}
        return cls(phase=PhaseResult(**phase), **fields)


def kept(keep: Path | None, policy: str, settings: dict, code: str | None) -> KeptResult | None:
    """The saved result of `policy` under these settings and code, if --keep holds one."""
    path = keep / f"{policy}.json" if keep else None
    if path is None or not path.exists():
        return None
    result = KeptResult.load(path)
    if result.settings != settings or result.code != code:
        print(f"policy {policy}: {path} was trained with other settings or code; training again", flush=True)
        return None
    print(f"policy {policy}: reusing {path}, trained at {result.revision}", flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300, help="measured steps per policy, after the warm-up")
    parser.add_argument("--policies", help="compression policies, the baseline first (default: model,none,fp16,8bit; "
                                           "with --data-period: model,aq-sgd)")
    parser.add_argument("--data-period", type=int, help="steps per pass over a repeating data order")
    parser.add_argument("--passes", type=int, default=3, help="passes to train with --data-period (the first is the "
                                                               "warm-up)")
    parser.add_argument("--layout", choices=sorted(LAYOUTS), default="demo",
                        help="demo: the tiny model; bandwidth-bound: the small model, bytes most of the step")
    parser.add_argument("--bandwidth-scale", type=float, help="emulated bandwidths × this (default: the layout's)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--section", help="RESULTS.md section to write (default: compression, or "
                                          "activation-deltas with --data-period)")
    parser.add_argument("--keep", type=Path, help="folder to save each policy's result in, and to reuse saved "
                                                  "results of the same settings and code from")
    parser.add_argument("--baseline", type=Path, help="a kept result of the first policy to compare against, "
                                                      "reused whatever swarm code it trained on (the section names it)")
    args = parser.parse_args()
    period = args.data_period
    policies = (args.policies or ("model,aq-sgd" if period else "model,none,fp16,8bit")).split(",")
    warmup, steps = (period, (args.passes - 1) * period) if period else (2, args.steps)
    layout = LAYOUTS[args.layout]
    bandwidth_scale = args.bandwidth_scale or layout.bandwidth_scale
    model_name, model = layout.model, get_model_config(layout.model)
    use_a_fresh_throughput_cache(layout)
    settings = {"layout": args.layout, "bandwidth_scale": bandwidth_scale, "seed": args.seed,
                "data_period": period, "warmup": warmup, "steps": steps, "lr_warmup_steps": layout.lr_warmup_steps}
    code, started_at = (swarm_code() if args.keep else None), revision()
    if args.keep:
        if code is None:
            raise SystemExit(f"--keep: commit the changes to {', '.join(SWARM_CODE)} first, so that a kept result "
                             f"names the code it ran")
        args.keep.mkdir(parents=True, exist_ok=True)

    results: dict[str, PhaseResult] = {}
    floors: dict[str, float] = {}
    reused_from: dict[str, str] = {}
    identities = args.keep / "keys" if args.keep else None  # the peers' keys: every policy plans the same peers
    started = time.monotonic()
    for policy in policies:
        if policy == policies[0] and args.baseline:
            baseline = KeptResult.load(args.baseline)
            if baseline.settings != settings:
                raise SystemExit(f"--baseline {args.baseline} trained with other settings: {baseline.settings}")
            results[policy], floors[policy] = baseline.phase, baseline.floor_s
            continue
        if reused := kept(args.keep, policy, settings, code):
            results[policy], floors[policy], reused_from[policy] = reused.phase, reused.floor_s, reused.revision
            continue
        workdir = Path(tempfile.mkdtemp(prefix=f"hetswarm-{policy}-"))
        if identities and identities.exists():
            copy_identities(identities, workdir / "keys")
        config = DemoConfig(placements=("scheduled",), steps=(steps,), warmup_steps=warmup, compression=policy,
                            workdir=workdir, data_period=period, bandwidth_scale=bandwidth_scale, model=model_name,
                            seed=args.seed, step_timeout_s=600.0, start_timeout_s=600.0,
                            emulate_tflops=layout.emulate_tflops, lr_warmup_steps=layout.lr_warmup_steps)
        print(f"policy {policy}: training {warmup} + {steps} steps; logs: {workdir}", flush=True)
        results[policy] = phase = run_swarm(config)[0]
        floors[policy] = bytes_free_floor(workdir / "run-scheduled" / "plan.json")
        if identities is None:
            identities = workdir / "keys"
        elif not identities.exists():
            copy_identities(workdir / "keys", identities)
        print(f"policy {policy}: {phase.wire}, {phase.measured_step_s:.3f} s/step measured, "
              f"{phase.predicted_step_s:.3f} predicted, loss {_final_loss(phase):.4f}", flush=True)
        if args.keep:
            KeptResult(settings, code, started_at, phase, floors[policy]).save(args.keep / f"{policy}.json")
        if args.layout == "bandwidth-bound" and len(results) == 1:
            share = 1 - floors[policy] / phase.predicted_step_s
            print(f"layout: transfers' bytes are {share:.0%} of {policy}'s predicted step", flush=True)
            if share < BANDWIDTH_BOUND_SHARE:
                raise SystemExit(f"not bandwidth-bound: {share:.0%} < {BANDWIDTH_BOUND_SHARE:.0%}; lower "
                                 f"--bandwidth-scale (now {bandwidth_scale})")
    wall_s = time.monotonic() - started

    base = results[policies[0]]
    rows = []
    for policy, phase in results.items():
        rows.append(f"| {policy} | {phase.wire} | {phase.measured_step_s:.3f} | {phase.predicted_step_s:.3f} | "
                    f"{phase.error:+.0%} | {phase.compute_s:.3f} | {phase.wait_s:.3f} | "
                    f"{base.measured_step_s / phase.measured_step_s:.2f}× | {_final_loss(phase):.4f} | "
                    f"{_final_loss(phase) / _final_loss(base) - 1:+.1%} |")
    last_step = max(max(phase.losses) for phase in results.values())
    swarm = "the bandwidth-bound layout" if args.layout == "bandwidth-bound" else "the demo's world-wide swarm"
    title = (f"Activation deltas on {swarm}: {args.passes} passes of a {period}-step data order" if period else
             f"Compression: {swarm} under each wire policy, {steps} steps")
    order = (f"a data order that repeats every {period} steps (step s trains on the micro-batches of step s mod "
             f"{period}), for {args.passes} passes: the first ({warmup} steps) is the warm-up, in which AQ-SGD sends "
             f"activations whole; {steps} steps are measured" if period else
             f"the same data, for {warmup} warm-up and {steps} measured steps")
    pinned = (f"; every client computes as slowly as a {layout.tflops}-TFLOPS device (`--emulate-tflops`), so that "
              f"the live model prices the compute it does" if layout.tflops else "")
    if layout.lr_warmup_steps:
        pinned += f"; the learning rate warms up over the first {layout.lr_warmup_steps} steps"
    turns = (f" Trained by an earlier run with the same settings and code, and reused (--keep): "
             f"{', '.join(f'{policy} at {rev}' for policy, rev in reused_from.items())}; the minutes are this run's."
             if reused_from else "")
    if args.baseline:
        turns += (f" The baseline, `{policies[0]}`, is {args.baseline}: the same settings, trained at "
                  f"{baseline.revision} on other swarm code (--baseline).")
    markdown = f"""## {title}

Command: `{command_line()}` at {started_at} on the project's 2-core machine, {wall_s / 60:.0f} min.{turns}

8 clients (Oregon, Tokyo, Frankfurt, Seoul, two each) as separate processes on 127.0.0.1, links emulated from the
DT-FM world-wide scenario with every bandwidth × {bandwidth_scale}; {model_name} model ({model.total_params / 1e6:.1f} M
parameters), 2 pipelines × 4 stages, GPipe with {model.micro_batches} micro-batches, the scheduled plan{pinned}. Each policy trains on a fresh swarm of the same identities, from the same seed on
{order}. Measured: median over the peers of the step period; predicted:
the coordinator's live model with the bytes of the chosen codecs; loss: mean of the last stages' losses over the last
{LOSS_WINDOW} steps (up to step {last_step}). Speed-up and loss change are against `{policies[0]}`, the wire before
compression (fp16 activations, fp32 all-reduce).

| policy | wire | measured (s/step) | predicted (s/step) | measured vs predicted | compute (s/step) | waiting (s/step) | speed-up | loss | loss vs {policies[0]} |
|---|---|---|---|---|---|---|---|---|---|
{chr(10).join(rows)}
{_targets(results, policies[0], floors[policies[0]])}{_floor(floors[policies[0]], base)}{_curve(results, policies[0])}"""
    print(markdown)
    write_section(args.section or ("activation-deltas" if period else "compression"), markdown)


if __name__ == "__main__":
    main()
