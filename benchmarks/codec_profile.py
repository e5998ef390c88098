"""Where a step's CPU goes under each wire: py-spy samples of every client of the demo's swarm, by phase.

The swarm of benchmarks/compression.py (8 clients, links emulated from the DT-FM world-wide scenario with bandwidths
scaled, on 2 pipelines × 4 stages the tiny model, or the small one of its bandwidth-bound layout) trains once per
compression policy. After the warm-up, py-spy samples each client's process (all its threads, idle ones left out, so
a sample is a thread on the CPU; not its DHT process) for a window of steps; every sample is put in a phase by the
code on its stack (`phase_of`): a codec's work is the codec's, the rest goes to the part of the step it is in. A
phase's CPU seconds per step per client is its samples / the rate / the steps in the window / the clients; the codec
phases' sum, against the measured step time, is the share the issue bounds at 10 %. Needs py-spy
(`pip install py-spy`; it reads the clients' memory, so it runs as their user). Writes the "codec-profile" section
of benchmarks/RESULTS.md, or --section.

    python benchmarks/codec_profile.py [--policies model,8bit,auto,aq-sgd,sparse] [--window 60]
                                       [--bandwidth-scale 0.002]
    python benchmarks/codec_profile.py --layout bandwidth-bound --policies model,8bit,aq-sgd,powersgd --window 90
                                       --steps 22 --section codec-profile-bandwidth-bound
"""
from __future__ import annotations

import argparse
import collections
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
from compression import LAYOUTS, copy_identities, use_a_fresh_throughput_cache
from results import command_line, revision, write_section  # benchmarks/ is on sys.path when run as a script

from hetswarm.client.local.demo import DemoConfig, DemoWatch, PhaseResult, run_swarm

CODEC_MODULES = (("codec: activation deltas", "client/training/activation_deltas.py:"),
                 ("codec: error feedback", "client/training/error_feedback.py:"),
                 ("codec: gradient sample", "client/training/gradient_sample.py:"),
                 ("codec: low-rank factors", "client/training/low_rank.py:"))
"""Code that exists for a codec: all its work is the codec's."""
CODEC_CODE = ("protocol/codecs.py:", "hivemind/compression/")
"""The codecs themselves, charged to the transfer that called them."""
ALLREDUCE = ("client/training/exact_allreduce.py:", "client/training/group_allreduce.py:", "hivemind/averaging/")
FRAMES = ("client/training/neighbour_streams.py:", "protocol/framing.py:")
COMPUTE = ("client/training/stage_passes.py:", "torch/autograd/", "torch/nn/modules/")
PHASES = (*(phase for phase, _ in CODEC_MODULES), "codec: all-reduce parts", "codec: pipeline frames",
          "all-reduce (besides codecs)", "frames (besides codecs)", "forward and backward")
OTHER = "other (DHT, p2p, records, event loop)"
WAITING = "waiting"
WAITS = ("_worker", "EpollSelector.select", "socket.accept", "Connection._recv")
"""Innermost frames of a thread blocked in C (a pool worker's empty queue, the event loop's select, a listener, a
pipe): py-spy's idle check lets them through here, so they are counted apart, as waiting, not as CPU."""
PY_SPY = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
"""On the PATH, or beside this interpreter (a virtual environment not activated)."""
PROFILE_RATE = 50
"""Samples per second per process: 8 samplers stay light beside the 2 cores the swarm trains on."""


@dataclass
class Profile:
    """Samples by phase, summed over the clients profiled."""

    by_phase: collections.Counter = field(default_factory=collections.Counter)
    clients: int = 0

    def add(self, raw: str) -> None:
        """One client's py-spy `--format raw` output: a collapsed stack and its count per line."""
        self.clients += 1
        for line in raw.splitlines():
            stack, _, count = line.rpartition(" ")
            if stack and count.isdigit():
                self.by_phase[phase_of(stack)] += int(count)

    def per_step_s(self, phase: str, steps: float) -> float:
        """CPU seconds per step per client spent in `phase`."""
        return self.by_phase[phase] / PROFILE_RATE / steps / max(self.clients, 1)


def phase_of(stack: str) -> str:
    """The phase of a collapsed stack ("outer;...;inner", each frame "function (path:line)"): a codec's work is the
    codec's whoever called it, the rest goes to the innermost part of the step it is in."""
    frames = [_where(frame) for frame in stack.split(";")]
    if stack.rpartition(";")[2].partition(" (")[0] in WAITS:
        return WAITING

    def on_stack(wheres: tuple[str, ...]) -> bool:
        return any(where in frame for frame in frames for where in wheres)

    for phase, module in CODEC_MODULES:
        if on_stack((module,)):
            return phase
    if on_stack(CODEC_CODE):
        return "codec: all-reduce parts" if on_stack(ALLREDUCE) else "codec: pipeline frames"
    for phase, wheres in (("all-reduce (besides codecs)", ALLREDUCE), ("frames (besides codecs)", FRAMES),
                          ("forward and backward", COMPUTE)):
        if on_stack(wheres):
            return phase
    return OTHER


def _where(frame: str) -> str:
    """"encode_tensor (/x/protocol/codecs.py:151)" → "/x/protocol/codecs.py:encode_tensor"."""
    function, _, location = frame.partition(" (")
    return f"{location.rsplit(':', 1)[0]}:{function}"


class Sampler:
    """Starts py-spy on every client once the plan's step reaches `start_step`, for `window_s` seconds."""

    def __init__(self, start_step: int, window_s: float, out: Path) -> None:
        self.start_step, self.window_s, self.out = start_step, window_s, out
        self.processes: list[subprocess.Popen] = []
        self.started_at: int | None = None

    def on_update(self, watch: DemoWatch) -> None:
        steps = [record.step for record in watch.latest.values() if record.health == "training"]
        if self.started_at is None and steps and min(steps) >= self.start_step:
            self.started_at = min(steps)
            self.processes = [subprocess.Popen([PY_SPY, "record", "--pid", str(pid), "--rate", str(PROFILE_RATE),
                                                "--duration", str(int(self.window_s)), "--format", "raw",
                                                "--output", str(self.out / f"{pid}.txt")],
                                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                              for pid in _client_pids()]

    def profile(self) -> Profile:
        """The samples py-spy wrote, once every sampler ended (each stops by itself after the window)."""
        for process in self.processes:
            process.wait(timeout=self.window_s + 60)
        profile = Profile()
        for path in sorted(self.out.glob("*.txt")):
            profile.add(path.read_text())
        return profile


def _client_pids() -> list[int]:
    """This benchmark's `hetswarm join` processes (the demo starts each client as one), not their DHT processes
    (forked from them, so with the same command line)."""
    clients = {}
    for child in psutil.Process(os.getpid()).children(recursive=True):
        try:
            command, parent = child.cmdline(), child.ppid()
        except psutil.NoSuchProcess:
            continue
        if "join" in command and "--public-name" in command:
            clients[child.pid] = parent
    return [pid for pid, parent in clients.items() if parent not in clients]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policies", default="model,8bit,auto,aq-sgd,sparse")
    parser.add_argument("--window", type=float, default=60.0, help="seconds profiled per policy")
    parser.add_argument("--warmup", type=int, default=8, help="steps before the window")
    parser.add_argument("--layout", choices=sorted(LAYOUTS), default="demo", help="compression.py's layouts")
    parser.add_argument("--bandwidth-scale", type=float, help="emulated bandwidths × this (default: the layout's)")
    parser.add_argument("--steps", type=int, help="steps per policy after 2 warm-up ones (default: enough for "
                                                  "steps of at least a second)")
    parser.add_argument("--data-period", type=int, default=4, help="steps per pass (aq-sgd sends deltas from the "
                                                                    "second pass on)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--section", default="codec-profile", help="RESULTS.md section to write")
    args = parser.parse_args()
    if PY_SPY is None:
        raise SystemExit("codec_profile needs py-spy: pip install py-spy")
    policies = args.policies.split(",")
    layout = LAYOUTS[args.layout]
    use_a_fresh_throughput_cache(layout)
    rows, wall = [], time.monotonic()
    keys: Path | None = None
    for policy in policies:
        workdir = Path(tempfile.mkdtemp(prefix=f"hetswarm-profile-{policy}-"))
        if keys is not None:  # the same identities, so that every policy plans the same peers
            copy_identities(keys, workdir / "keys")
        sampler = Sampler(args.warmup, args.window, workdir)
        steps = args.steps or args.warmup + 2 + int(args.window)  # steps of a second or more outlast the window
        config = DemoConfig(placements=("scheduled",), steps=(steps,), warmup_steps=2, compression=policy,
                            workdir=workdir, bandwidth_scale=args.bandwidth_scale or layout.bandwidth_scale,
                            model=layout.model, seed=args.seed, data_period=args.data_period, step_timeout_s=600.0,
                            start_timeout_s=600.0, emulate_tflops=layout.emulate_tflops)
        print(f"policy {policy}: {steps} steps, profiled from step {args.warmup} for {args.window:.0f} s; logs: "
              f"{workdir}", flush=True)
        phase = run_swarm(config, on_update=sampler.on_update)[0]
        keys = keys or workdir / "keys"
        rows.append(_row(policy, phase, sampler))
        print(rows[-1], flush=True)
    header = ["policy", "wire", "measured (s/step)", *PHASES, OTHER, f"{WAITING} (not CPU)", "codecs / step"]
    on = ", the bandwidth-bound layout" if args.layout == "bandwidth-bound" else ""
    markdown = f"""## Codec CPU per step: py-spy on every client, by phase{on}

Command: `{command_line()}` at {revision()} on the project's 2-core machine, {(time.monotonic() - wall) / 60:.0f} min.

{__doc__.split(chr(10) * 2)[1]}

Each phase column: CPU seconds per step per client (mean over the 8 clients); the waiting column counts samples of
threads blocked in C that py-spy took for running (`WAITS`). The data order repeats every
{args.data_period} steps, so aq-sgd sends deltas through the window.

| {" | ".join(header)} |
|{"---|" * len(header)}
{chr(10).join(rows)}
"""
    print(markdown)
    write_section(args.section, markdown)


def _row(policy: str, phase: PhaseResult, sampler: Sampler) -> str:
    profile = sampler.profile()
    if sampler.started_at is None or phase.measured_step_s is None:
        raise SystemExit(f"policy {policy}: the run ended before the window was profiled")
    steps = sampler.window_s / phase.measured_step_s
    seconds = [profile.per_step_s(name, steps) for name in (*PHASES, OTHER, WAITING)]
    codecs = sum(s for name, s in zip(PHASES, seconds) if name.startswith("codec"))
    cells = [policy, phase.wire, f"{phase.measured_step_s:.3f}", *(f"{s:.3f}" for s in seconds),
             f"{codecs:.3f} s, {codecs / phase.measured_step_s:.1%} of the step"]
    return f"| {' | '.join(cells)} |"


if __name__ == "__main__":
    main()
