"""Can a 1,000-peer swarm be planned from ~16 measured links per peer? The measurement policy, the link estimator and
the scheduler on a synthetic network, against the same scheduler on the true links.

The true network is the scheduler benchmark's geo-distributed swarm (benchmarks/scheduler.py: the ten regions of the
paper's world-wide table with uneven counts, each device behind its own access link of 0–2 ms and 1–4 Gbit/s). Each
peer chooses its links as a volunteer does in its first epoch, with no plan yet (protocol/measurement_policy.py),
and the smaller id of each chosen pair probes it; a probe reports the true figures off by a few per cent
(log-normal noise). The records go through the coordinator's own path (coordinator/swarm_view.py: the held-out
error, the fit, the pessimistic pricing of estimated links); the scheduler plans on that view, and the plan found is
priced on the true links beside the plan the same search finds on the true links. Paper cost model
(paper-gpt3-xl).

Writes the "scale-sim" section of benchmarks/RESULTS.md.

    python benchmarks/scale_sim.py [--peers 1000] [--pp 10] [--max-links 16] [--time-budget 40] [--seed 0]
"""
from __future__ import annotations

import argparse
import time

import numpy as np
from results import command_line, write_section  # benchmarks/ is on sys.path when run as a script
from scheduler import PAPER_MODEL, geo_swarm

from hetswarm.coordinator.link_estimate import describe_error, fit_links
from hetswarm.coordinator.scheduling.baselines import random_placement
from hetswarm.coordinator.scheduling.cost_model import PaperCostModel, Payloads
from hetswarm.coordinator.scheduling.plan import cost_plan
from hetswarm.coordinator.scheduling.scheduler import find_plan
from hetswarm.coordinator.scheduling.search import SearchConfig
from hetswarm.coordinator.swarm_view import build_view
from hetswarm.protocol.measurement_policy import links_to_measure
from hetswarm.protocol.network import Network
from hetswarm.protocol.record_store import encode_record, stored_bytes
from hetswarm.protocol.records import Hardware, LinkMeasurement, PeerRecord
from hetswarm.protocol.units import MBPS_PER_GBPS

SETUP = __doc__.split("\n\n")[1]
BASE58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
NOISE = 0.03
"""Log-normal spread of a probe's figures around the truth."""


def peer_ids(n: int) -> list[str]:
    """Valid peer ids whose sorted order is their index order (fixed width, base58 digits in ASCII order)."""
    def digits(index: int) -> str:
        out = ""
        for _ in range(8):
            index, digit = divmod(index, len(BASE58))
            out = BASE58[digit] + out
        return out
    return [f"Qm{'1' * 36}{digits(i)}" for i in range(n)]


def probe(truth: Network, ids: list[str], max_links: int, seed: int) -> tuple[dict[str, PeerRecord], list[int]]:
    """Every peer's record after its first epoch of measurement, and how many probes each peer ran."""
    rng = np.random.default_rng(seed)
    index = {peer: i for i, peer in enumerate(ids)}
    sites = {peer: truth.sites[i] for i, peer in enumerate(ids)}
    views = {peer: _SiteOnly(site) for peer, site in sites.items()}
    hardware = Hardware(device="cpu", device_name="simulated", tflops=1.0, dtype="float32", memory_gib=4.0)
    links: dict[str, dict[str, LinkMeasurement]] = {peer: {} for peer in ids}
    for me in ids:
        for other in links_to_measure(me, views, site=sites[me], partners=(), budget=max_links, epoch=0):
            if other > me:  # the smaller id probes
                i, j = index[me], index[other]
                noise = float(np.exp(rng.normal(0.0, NOISE)))
                links[me][other] = LinkMeasurement(
                    latency_ms=float(truth.latency_ms[i, j]) * noise,
                    bandwidth_mbps=float(truth.bandwidth_gbps[i, j]) * MBPS_PER_GBPS / noise,
                    measured_at=0.0, samples=5)
    records = {peer: PeerRecord(peer_id=peer, maddrs=[], version="sim", hardware=hardware, links=links[peer],
                                state="ready", site=sites[peer], updated_at=0.0) for peer in ids}
    return records, [len(links[peer]) for peer in ids]


class _SiteOnly:
    """What links_to_measure reads of a peer's record: its site."""

    def __init__(self, site: str) -> None:
        self.site = site


def unmeasured_error(truth: Network, records: dict[str, PeerRecord], ids: list[str]) -> tuple[float, float]:
    """The models' median relative error (latency, bandwidth) on the pairs nobody measured, before pricing."""
    n, index = len(ids), {peer: i for i, peer in enumerate(ids)}
    latency, bandwidth, measured = np.zeros((n, n)), np.zeros((n, n)), np.zeros((n, n), dtype=bool)
    for i, peer in enumerate(ids):
        for other, link in records[peer].links.items():
            j = index[other]
            latency[i, j] = latency[j, i] = link.latency_ms
            bandwidth[i, j] = bandwidth[j, i] = link.bandwidth_mbps
            measured[i, j] = measured[j, i] = True
    model = fit_links(latency, bandwidth, measured, tuple(truth.sites))
    rows, cols = np.nonzero(np.triu(~measured, 1))
    true_latency, true_bandwidth = truth.latency_ms[rows, cols], truth.bandwidth_gbps[rows, cols] * MBPS_PER_GBPS
    return (float(np.median(np.abs(model.latency_ms(rows, cols) - true_latency) / true_latency)),
            float(np.median(np.abs(model.bandwidth_mbps(rows, cols) - true_bandwidth) / true_bandwidth)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peers", type=int, default=1000)
    parser.add_argument("--pp", type=int, default=10, help="pipeline stages; the peers must divide into them")
    parser.add_argument("--max-links", type=int, default=16, help="each peer's measurement budget k")
    parser.add_argument("--time-budget", type=float, default=40.0, help="the scheduler's search budget, seconds")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    d_pp, d_dp = args.pp, args.peers // args.pp
    if d_pp * d_dp != args.peers:
        parser.error(f"{args.peers} peers do not divide into {d_pp} stages")
    truth = geo_swarm(args.peers, args.seed)
    ids = peer_ids(args.peers)
    records, probes = probe(truth, ids, args.max_links, args.seed)
    record_bytes = max(stored_bytes(encode_record(record)) for record in records.values())
    pairs = args.peers * (args.peers - 1) // 2
    started = time.perf_counter()
    view = build_view(records)
    view_s = time.perf_counter() - started
    assert view.peer_ids == tuple(ids)
    latency_error, bandwidth_error = unmeasured_error(truth, records, ids)
    print(f"{sum(probes)} links measured ({sum(probes) / pairs:.1%} of pairs), at most {max(probes)} probes per "
          f"peer; view in {view_s:.1f} s; unmeasured error: latency {latency_error:.1%}, bandwidth "
          f"{bandwidth_error:.1%}; {describe_error(view.estimate_error)}", flush=True)

    payloads = Payloads.from_model(PAPER_MODEL, d_dp=d_dp, d_pp=d_pp)
    true_model = PaperCostModel(truth, payloads, d_dp=d_dp, d_pp=d_pp)
    config = SearchConfig(time_budget_s=args.time_budget, seed=args.seed)
    started = time.perf_counter()
    on_estimates = find_plan(view.network, payloads, d_dp=d_dp, d_pp=d_pp, config=config)
    search_s = time.perf_counter() - started
    priced_true = cost_plan(true_model, on_estimates.plan.grid).cost_s
    on_truth = find_plan(truth, payloads, d_dp=d_dp, d_pp=d_pp, config=config).plan.cost_s
    random_s = random_placement(true_model, samples=200, seed=args.seed).cost_s
    print(f"plan on estimates: {priced_true:.3f} s on the true links (it expected {on_estimates.plan.cost_s:.3f}); "
          f"on the true links: {on_truth:.3f} s; random: {random_s:.3f} s", flush=True)

    write_section("scale-sim", "\n".join([
        "## Planning 1,000 peers from sparse measurements (simulated)",
        "",
        f"Command: `{command_line()}` on the project's 2-core machine. {' '.join(SETUP.split())}",
        "",
        "| measure | value |",
        "|---|---|",
        f"| peers, plan | {args.peers}, {d_pp} stages × {d_dp} pipelines |",
        f"| probes per peer (budget k = {args.max_links}) | at most {max(probes)}, mean {np.mean(probes):.1f} |",
        f"| pairs measured | {sum(probes):,} of {pairs:,} ({sum(probes) / pairs:.1%}) |",
        f"| largest peer record as stored (with its signature) | {record_bytes:,} bytes |",
        f"| latency estimate, median error on unmeasured pairs | {latency_error:.1%} |",
        f"| bandwidth estimate, median error on unmeasured pairs | {bandwidth_error:.1%} |",
        f"| the estimator's own figure (held-out measured links) | {describe_error(view.estimate_error)} |",
        f"| view: records → matrices, fit, validation, pricing | {view_s:.1f} s |",
        f"| search on the estimated view (budget {args.time_budget:.0f} s) | {search_s:.1f} s |",
        f"| **planning, view + search** | **{view_s + search_s:.1f} s** |",
        f"| plan found on estimates, priced on the true links | {priced_true:.3f} s |",
        f"| plan found on the true links (same search) | {on_truth:.3f} s |",
        f"| **estimates' plan vs true links' plan** | **{priced_true / on_truth - 1:+.1%}** |",
        f"| random placement, best of 200, true links | {random_s:.3f} s |",
    ]))


if __name__ == "__main__":
    main()
