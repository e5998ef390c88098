"""Does the scheduled plan train faster end to end, and does the live cost model predict its step time?

One swarm of `hetswarm` processes on this machine (a coordinator and 8 clients, by default two per world-wide region, links
emulated from the DT-FM world-wide scenario with scaled bandwidth) trains the tiny model three times: under the
scheduled plan, a random plan and default placement (peer-id order, as Megatron would place devices). Each run is a
fresh swarm of the same identities and sites. Measured step time: the median over peers of the step period after
the warm-up, from the Progress records (hetswarm.client.local.demo). Predicted: the coordinator's live cost model, as
published in the assignment. Writes the "swarm" section of benchmarks/RESULTS.md.

    python benchmarks/swarm.py [--steps 12] [--bandwidth-scale 0.005] [--seed 0] [--per-region 2] [--regions A,B,...]
"""
from __future__ import annotations

import argparse
import time

from results import command_line, write_section  # benchmarks/ is on sys.path when run as a script

from hetswarm.client.local.demo import REGIONS, DemoConfig, run_swarm

PLACEMENTS = ("scheduled", "random", "default")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12, help="measured steps per plan, after the warm-up")
    parser.add_argument("--bandwidth-scale", type=float, default=0.005)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--per-region", type=int, default=2, help="clients per world-wide region")
    parser.add_argument("--regions", default=",".join(REGIONS), help="regions the clients fill, in order")
    args = parser.parse_args()
    regions = tuple(args.regions.split(","))

    config = DemoConfig(clients=args.clients, regions=regions, clients_per_region=args.per_region,
                        placements=PLACEMENTS, steps=(args.steps,) * len(PLACEMENTS),
                        bandwidth_scale=args.bandwidth_scale, seed=args.seed)
    started = time.monotonic()
    phases = run_swarm(config, on_workdir=lambda path: print(f"logs: {path}", flush=True))
    wall_s = time.monotonic() - started
    by_name = {phase.placement: phase for phase in phases}
    scheduled = by_name["scheduled"]

    rows = []
    for phase in phases:
        speedup = phase.measured_step_s / scheduled.measured_step_s
        rows.append(f"| {phase.placement} | {phase.measured_step_s:.2f} | {phase.predicted_step_s:.2f} | "
                    f"{phase.error:+.0%} | {phase.compute_s:.3f} | {phase.wait_s:.2f} | "
                    f"{phase.breakdown.get('data_parallel_s', 0):.2f} | {phase.breakdown.get('pipeline_parallel_s', 0):.2f} | "
                    f"{speedup:.2f}× |")
    losses = sorted(scheduled.losses.items())
    sites = ", ".join(f"{region} ×{args.per_region}" for region in regions[: args.clients // args.per_region])
    markdown = f"""## End to end: emulated world-wide swarm, {args.per_region} clients per region

Command: `{command_line()}` on the project's 2-core machine (shared with other jobs), {wall_s / 60:.1f} min.

{args.clients} clients ({sites}) as separate processes on 127.0.0.1, links emulated from the DT-FM world-wide
scenario with every bandwidth × {args.bandwidth_scale} (so that the tiny model's 32 KiB activations and 282 KB
gradient all-reduce per stage outweigh its compute on the shared CPU); tiny model, 2 pipelines × 4 stages, GPipe
with 2 micro-batches, fp16 activations on the wire. Each plan runs on a fresh swarm of the same identities and
sites; {config.warmup_steps} warm-up steps, then {args.steps} measured. Measured: median over the 8 peers of the
step period from their Progress records. Predicted: the coordinator's live cost model (coordinator/scheduling/live_cost.py: all-reduces,
per-micro-batch hops, compute and bubble, on the measured links and TFLOPS) as published in the assignment.

| plan | measured (s/step) | predicted (s/step) | measured vs predicted | compute (s/step) | waiting (s/step) | predicted DataP (s) | predicted pipeline transfers (s) | slower than scheduled |
|---|---|---|---|---|---|---|---|---|
{chr(10).join(rows)}

Targets: scheduled ≥ 2× faster than random — measured {by_name['random'].measured_step_s / scheduled.measured_step_s:.2f}×;
scheduled within 20 % of its prediction — {scheduled.error:+.0%}.
Loss under the scheduled plan (mean of the last stages): {losses[0][1]:.3f} at step {losses[0][0]} →
{losses[-1][1]:.3f} at step {losses[-1][0]}.
"""
    print(markdown)
    write_section(f"swarm-{args.per_region}-per-region", markdown)


if __name__ == "__main__":
    main()
