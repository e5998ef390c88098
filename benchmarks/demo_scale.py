"""Does `hetswarm demo` hold 32 clients on this machine, half of them standing by, with sparse measurement?

The demo's own swarm (client/local/demo.py: a bootstrap, N clients as separate processes on 127.0.0.1, links
emulated from the world-wide scenario, then a coordinator), one scheduled plan of dp × pp placed clients, the others
standing by. While it runs, a sampler sums the resident and proportional memory of every process below this one
(PSS counts a page shared by k processes as 1/k of it: the memory the swarm really takes). From what the demo's
watch read: peers seen and the most links any record listed. From the logs: whether the coordinator ever counted a
live client as left, and how often a client's record found no DHT node.

Writes the "demo-scale" section of benchmarks/RESULTS.md.

    python benchmarks/demo_scale.py [--clients 32] [--dp 4] [--pp 4] [--steps 6] [--start-timeout 900]
"""
from __future__ import annotations

import argparse
import os
import signal
import threading
import time
from pathlib import Path

import psutil
from results import command_line, write_section  # benchmarks/ is on sys.path when run as a script
from swarm_log_lines import departures_counted, estimated_links, planned_out, unstored_records

from hetswarm.client.local.demo import DemoConfig, DemoWatch, run_swarm
from hetswarm.protocol.errors import HetswarmError

SETUP = __doc__.split("\n\n")[1]
MIN_AVAILABLE_BYTES = 1 << 30
"""Below this much free memory the run is interrupted (the demo then stops every process it started)."""


class TreeMemory:
    """Peak RSS and PSS sums over this process's descendants, and the peak load average, sampled until stopped."""

    def __init__(self, interval_s: float = 5.0) -> None:
        self.peak_rss = self.peak_pss = 0
        self.peak_processes = 0
        self.peak_load = 0.0
        self.low_memory = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, args=(interval_s,), daemon=True)
        self._thread.start()

    def _sample(self, interval_s: float) -> None:
        while not self._stop.wait(interval_s):
            rss = pss = 0
            children = psutil.Process(os.getpid()).children(recursive=True)
            for child in children:
                try:
                    info = child.memory_full_info()
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    continue
                rss, pss = rss + info.rss, pss + info.pss
            self.peak_rss, self.peak_pss = max(self.peak_rss, rss), max(self.peak_pss, pss)
            self.peak_processes = max(self.peak_processes, len(children))
            self.peak_load = max(self.peak_load, os.getloadavg()[0])
            if psutil.virtual_memory().available < MIN_AVAILABLE_BYTES and not self.low_memory:
                self.low_memory = True
                os.kill(os.getpid(), signal.SIGINT)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--dp", type=int, default=4)
    parser.add_argument("--pp", type=int, default=4)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--start-timeout", type=float, default=900.0, help="for the clients to come up and measure")
    args = parser.parse_args()
    config = DemoConfig(clients=args.clients, dp=args.dp, stages=args.pp, placements=("scheduled",),
                        steps=(args.steps,), start_timeout_s=args.start_timeout, step_timeout_s=120.0)
    seen = {"peers": 0, "max_links": 0, "first_plan_s": None}
    workdir: list[Path] = []
    started = time.monotonic()

    def on_update(watch: DemoWatch) -> None:
        seen["peers"] = max(seen["peers"], len(watch.peers))
        seen["max_links"] = max([seen["max_links"], *(len(r.links) for r in watch.peers.values())])
        if watch.assignment is not None and seen["first_plan_s"] is None:
            seen["first_plan_s"] = time.monotonic() - started

    memory, failure = TreeMemory(), None
    try:
        phases = run_swarm(config, on_update=on_update, on_workdir=workdir.append)
    except HetswarmError as e:  # measured all the same: what the run got to, and why it stopped
        phases, failure = [], str(e).splitlines()[0]
    finally:
        memory.stop()
        print(f"logs: {workdir[0] if workdir else '?'}; low memory: {memory.low_memory}", flush=True)
    wall_s = time.monotonic() - started
    logs = workdir[0] / "run-scheduled"
    coordinator = (logs / "coordinator.log").read_text(errors="replace") if (logs / "coordinator.log").exists() else ""
    gib = 1 << 30
    left_out = departures_counted(coordinator) if coordinator else "no coordinator started"
    first_plan = f"{seen['first_plan_s'] / 60:.1f} min" if seen["first_plan_s"] is not None else "none"
    outcome = (f"{phases[0].measured_step_s:.2f} s, {phases[0].predicted_step_s:.2f} s" if phases
               else f"did not finish: {failure}")
    rows = [
        f"| clients, plan | {args.clients}, {args.pp} stages × {args.dp} pipelines, "
        f"{args.clients - args.pp * args.dp} standing by |",
        f"| wall time, first plan after start | {wall_s / 60:.1f} min, {first_plan} |",
        f"| peak memory of the process tree, PSS (RSS) | {memory.peak_pss / gib:.1f} GiB ({memory.peak_rss / gib:.1f} "
        f"GiB), {memory.peak_processes} processes |",
        f"| peers the watch saw | {seen['peers']} |",
        f"| most links one record listed | {seen['max_links']} |",
        f"| coordinator counted a live client as left | {left_out} |",
        f"| peers reported unreachable and planned out | {', '.join(planned_out(coordinator)) or 'none'} |",
        f"| client records no DHT node accepted (log lines) | {unstored_records(logs)} |",
        f"| estimated links the plan was priced on | {estimated_links(coordinator)} |",
        f"| step time measured, predicted | {outcome} |",
        f"| highest load average (1 min) | {memory.peak_load:.0f} on {os.cpu_count()} cores |",
    ]
    markdown = "\n".join([
        f"## The demo at {args.clients} clients",
        "",
        f"Command: `{command_line()}` on the project's 2-core, 23 GiB machine. {' '.join(SETUP.split())}",
        "",
        "| measure | value |",
        "|---|---|",
        *rows,
    ])
    print(markdown)
    write_section("demo-scale", markdown)


if __name__ == "__main__":
    main()
