"""Does the live objective pay end to end on mixed GPUs, and does the live model predict what it buys?

One swarm of `hetswarm` processes on this machine (a coordinator and 8 clients, two per world-wide region, links
emulated from the DT-FM world-wide scenario with scaled bandwidth) in which every other client computes as a device
4× slower (`hetswarm join --emulate-tflops`), trains the tiny model under four plans in turn: the live objective's
(`--plan scheduled --dp auto --pp auto`: the coordinator chooses the shape and which clients stand by), the paper
objective's (`--plan paper`: DT-FM's communication cost, the even cut), a random one and the default (device
order), the last three at 4 pipelines × 2 stages of all 8 clients, as DT-FM runs. Each run is a fresh swarm of the
same identities, sites and speeds. Measured: the median over peers of the step period after the warm-up
(hetswarm.client.local.demo). Predicted: the coordinator's live model, as published in the assignment. Writes the
"mixed-swarm" section of benchmarks/RESULTS.md.

    python benchmarks/mixed_swarm.py [--steps 12] [--bandwidth-scale 0.02] [--fast-tflops 0.0004] [--slowdown 4]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from results import command_line, write_section  # benchmarks/ is on sys.path when run as a script

from hetswarm.client.local.demo import DEMO_COMPRESSION, DemoConfig, run_swarm
from hetswarm.coordinator.planner import PlannerConfig, propose
from hetswarm.coordinator.scheduling.search import SearchConfig
from hetswarm.coordinator.swarm_view import SwarmView
from hetswarm.protocol.model_config import load_model_config
from hetswarm.protocol.network import load_hardware, load_network

PLACEMENTS = ("scheduled", "paper", "random", "default")
RANDOM_DRAWS = 200


def random_draws(plan_path: Path, *, draws: int, d_dp: int, d_pp: int) -> list[float]:
    """The live model's step time of `draws` random plans (the coordinator's `--plan random` with seeds 0, 1, ...)
    on the swarm a saved plan was made on: the measured random run is one draw, this is the spread of them."""
    devices = json.loads(plan_path.read_text())["devices"]
    tflops, memory = load_hardware(plan_path)
    view = SwarmView(peer_ids=tuple(d["peer_id"] for d in devices), names=tuple(d["name"] for d in devices),
                     network=load_network(str(plan_path)), tflops=tflops, memory_gib=memory, estimated={})
    model = load_model_config(str(plan_path))
    return [propose(view, PlannerConfig(model=model, d_dp=d_dp, d_pp=d_pp, placement="random",
                                        compression=DEMO_COMPRESSION, search=SearchConfig(seed=seed))).live.total_s
            for seed in range(draws)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12, help="measured steps per plan, after the warm-up")
    parser.add_argument("--bandwidth-scale", type=float, default=0.02)
    parser.add_argument("--fast-tflops", type=float, default=0.0004,
                        help="emulated TFLOPS of the fast clients (this machine must be faster)")
    parser.add_argument("--slowdown", type=float, default=4.0, help="the slow clients are this many times slower")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    speeds = (args.fast_tflops, args.fast_tflops / args.slowdown)
    config = DemoConfig(clients=8, dp=4, placements=PLACEMENTS, shape_chosen=("scheduled",),
                        steps=(args.steps,) * len(PLACEMENTS),
                        bandwidth_scale=args.bandwidth_scale, seed=args.seed, emulate_tflops=speeds)
    workdirs = {}
    started = time.monotonic()
    phases = run_swarm(config, on_workdir=lambda path: workdirs.setdefault("root", path))
    wall_s = time.monotonic() - started
    by_name = {phase.placement: phase for phase in phases}
    scheduled = by_name["scheduled"]
    random_run = workdirs["root"] / "run-random" / "plan.json"
    draws = random_draws(random_run, draws=RANDOM_DRAWS, d_dp=config.dp, d_pp=config.pp)
    quartiles = statistics.quantiles(draws, n=4)
    rows = []
    for phase in phases:
        plan = json.loads((workdirs["root"] / f"run-{phase.placement}" / "plan.json").read_text())
        runs = plan["execution"]
        cut = f"{plan['d_dp']}×{plan['d_pp']}, " + "/".join(str(b - a) for a, b in runs["stage_layers"])
        cut += f", {len(plan['standbys'])} standing by" if plan["standbys"] else ""
        cut += f", {runs['micro_batches']} µb {'1F1B' if runs['schedule'] == '1f1b' else 'GPipe'}"
        cut += ", recomputing" if runs["recompute"] else ""
        rows.append(f"| {phase.placement} | {phase.measured_step_s:.2f} | {phase.predicted_step_s:.2f} | "
                    f"{phase.error:+.0%} | {phase.breakdown.get('compute_s', 0):.2f} | "
                    f"{phase.breakdown.get('data_parallel_s', 0):.2f} | "
                    f"{phase.breakdown.get('pipeline_parallel_s', 0):.2f} | {cut} | "
                    f"{phase.measured_step_s / scheduled.measured_step_s:.2f}× |")
    markdown = f"""## End to end on mixed speeds: live objective vs paper objective vs random and default

Command: `{command_line()}` on the project's 2-core machine, {wall_s / 60:.1f} min.

8 clients (two per region: Oregon, Tokyo, Frankfurt, Seoul) as separate processes on 127.0.0.1, links emulated from
the DT-FM world-wide scenario with every bandwidth × {args.bandwidth_scale}; clients alternate between
{speeds[0]:g} and {speeds[1]:g} emulated TFLOPS (`--emulate-tflops`: each computation padded to as long as on such a
device). Tiny model (4 layers). The live plan's shape (pipelines × stages) and standbys are the coordinator's
choice (`--dp auto --pp auto`); the paper, random and default plans place all 8 clients as {config.dp} × {config.pp},
the fixed shape DT-FM plans for. {config.warmup_steps} warm-up steps, then {args.steps} measured, each plan on a fresh
swarm of the same identities, sites and speeds.

| plan | measured (s/step) | predicted (s/step) | measured vs predicted | predicted compute (s) | predicted DataP (s) | predicted pipeline transfers (s) | how it runs | slower than live |
|---|---|---|---|---|---|---|---|---|
{chr(10).join(rows)}

Targets: live ≥ 1.3× faster than paper-scheduled — measured
{by_name['paper'].measured_step_s / scheduled.measured_step_s:.2f}×; ≥ 2× faster than random — measured
{by_name['random'].measured_step_s / scheduled.measured_step_s:.2f}×; scheduled, random and default each within 15 % of
its prediction.

The random plan is one draw (seed {args.seed}), predicted {draws[args.seed]:.2f} s on its swarm. Over {RANDOM_DRAWS} draws
(seeds 0–{RANDOM_DRAWS - 1}) on the same measured swarm, the live model predicts a median of {quartiles[1]:.2f} s (quartiles
{quartiles[0]:.2f}–{quartiles[2]:.2f}, best {min(draws):.2f}): {quartiles[1] / scheduled.predicted_step_s:.2f}× the live plan's prediction.
"""
    print(markdown)
    write_section("mixed-swarm", markdown)


if __name__ == "__main__":
    main()
