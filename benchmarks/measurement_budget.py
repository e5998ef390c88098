"""What sparse link measurement costs and covers (protocol/measurement_policy.py), against measuring every pair.

A synthetic swarm of `--peers` peers spread over eight sites, the first 16 placed in a 4 × 4 plan (each stage's
four replicas a group, each pipeline a chain); every peer applies the policy with the default budget for
`--epochs` epochs, and the smaller id of each chosen pair measures it, as the prober does. Reported per swarm size:
the links each peer measures in one epoch (what its probes and its record cost), the share of all pairs measured in
one epoch and over all epochs, whether every link the plan uses is measured, and the time one peer takes to choose.
Writes the "measurement-budget" section of benchmarks/RESULTS.md.

    python benchmarks/measurement_budget.py [--peers 64 256 1000] [--epochs 10]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository, for the hetswarm package
from results import command_line, write_section  # noqa: E402  (benchmarks/ is on sys.path as a script)

from hetswarm.client.peer.volunteer import VolunteerConfig  # noqa: E402
from hetswarm.protocol.measurement_policy import links_to_measure  # noqa: E402

SITES = 8
PLAN = 4
"""The plan is PLAN pipelines of PLAN stages over the first PLAN² peers."""


def partners(index: int) -> set[int]:
    """The peers the 4 × 4 plan has peer `index` exchange with: its pipeline neighbours and its stage group."""
    if index >= PLAN * PLAN:
        return set()
    pipeline, stage = divmod(index, PLAN)
    neighbours = {pipeline * PLAN + s for s in (stage - 1, stage + 1) if 0 <= s < PLAN}
    return neighbours | {p * PLAN + stage for p in range(PLAN) if p != pipeline}


def measure(n: int, epochs: int, budget: int) -> dict:
    ids = [f"Qm{index:044d}" for index in range(n)]
    peers = {peer: SimpleNamespace(site=f"site{index % SITES}") for index, peer in enumerate(ids)}
    plan_pairs = {frozenset((ids[i], ids[j])) for i in range(PLAN * PLAN) for j in partners(i)}
    per_peer, shares, seen, choose_s, plan_measured = [], [], set(), [], True
    for epoch in range(epochs):
        measured = set()
        for index, me in enumerate(ids):
            started = time.perf_counter()
            chosen = links_to_measure(me, peers, site=peers[me].site, partners={ids[j] for j in partners(index)},
                                      budget=budget, epoch=epoch)
            choose_s.append(time.perf_counter() - started)
            mine = [peer for peer in chosen if peer > me]  # the smaller id measures
            per_peer.append(len(mine))
            measured |= {frozenset((me, peer)) for peer in mine}
        shares.append(len(measured) / (n * (n - 1) / 2))
        plan_measured &= plan_pairs <= measured
        seen |= measured
    return {"peers": n, "max_links": max(per_peer), "mean_links": statistics.fmean(per_peer),
            "all_pairs_links": n - 1, "epoch_share": statistics.fmean(shares), "covered": len(seen) / (n * (n - 1) / 2),
            "plan_measured": plan_measured, "choose_ms": 1e3 * statistics.median(choose_s)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peers", type=int, nargs="+", default=[64, 256, 1000])
    parser.add_argument("--epochs", type=int, default=10)
    args = parser.parse_args()
    budget = VolunteerConfig().max_links
    rows = []
    for n in args.peers:
        row = measure(n, args.epochs, budget)
        rows.append(row)
        print(row, flush=True)
    table = "\n".join(
        f"| {r['peers']} | {r['max_links']} (mean {r['mean_links']:.1f}) | {r['all_pairs_links']} | "
        f"{r['epoch_share']:.1%} | {r['covered']:.1%} | {'yes' if r['plan_measured'] else 'no'} | "
        f"{r['choose_ms']:.1f} |" for r in rows)
    write_section("measurement-budget", f"""## Sparse link measurement: links per peer and coverage

`{command_line()}` — budget {budget} links per peer (the default of `hetswarm join --max-links`), {SITES} sites, a
{PLAN} × {PLAN} plan over the first {PLAN * PLAN} peers, {args.epochs} epochs (one epoch = one `reprobe_s`, 10 min).

| peers | links a peer measures per epoch, max | all pairs: links per peer | pairs measured per epoch | pairs measured over all epochs | every plan link measured | ms to choose, per peer |
|---|---|---|---|---|---|---|
{table}
""")


if __name__ == "__main__":
    main()
