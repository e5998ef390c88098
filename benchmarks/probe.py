"""How well the link probe measures emulated links: one `hetswarm join` per world-wide region, every pair probed.

Run from the repository root: `python benchmarks/probe.py [--bandwidth-scale 0.05]`. Writes the "probe"
section of benchmarks/RESULTS.md: for each pair, the scenario's figures against the measured ones.
"""
from __future__ import annotations

import argparse
import statistics
import time

from results import command_line, write_section

from hetswarm.client.local.swarm import LocalSwarm
from hetswarm.client.peer.emulation import SiteLinks

SITES = ["Oregon", "Virginia", "Ohio", "Tokyo", "Seoul", "London", "Frankfurt", "Ireland"]


def error_pct(measured: float, expected: float) -> float:
    return 100 * (measured - expected) / expected


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--scenario", default="worldwide")
    parser.add_argument("--bandwidth-scale", type=float, default=0.05)
    parser.add_argument("--timeout", type=float, default=300.0)
    args = parser.parse_args()
    links = SiteLinks.from_scenario(args.scenario, bandwidth_scale=args.bandwidth_scale)

    started = time.monotonic()
    with LocalSwarm("probebench") as swarm:
        swarm.start_bootstrap()
        for site in SITES:
            swarm.start_client(site.lower(), "--emulate", args.scenario, "--site", site,
                               "--bandwidth-scale", str(args.bandwidth_scale), "--ttl", "60")
        snapshot = swarm.poll(lambda s: s["counts"]["peers"] == len(SITES)
                              and s["counts"]["pairs_measured"] == s["counts"]["pairs"], timeout_s=args.timeout)
    elapsed = time.monotonic() - started

    site_of = {p["peer_id"]: p["site"] for p in snapshot["peers"]}
    rows, latency_errors, bandwidth_errors = [], [], []
    for link in sorted(snapshot["links"], key=lambda l: (site_of[l["src"]], site_of[l["dst"]])):
        a, b = site_of[link["src"]], site_of[link["dst"]]
        latency_ms, bandwidth_mbps = links.link(a, b)
        lat_err = link["latency_ms"] - latency_ms
        bw_err = error_pct(link["bandwidth_mbps"], bandwidth_mbps)
        latency_errors.append(abs(lat_err) if abs(lat_err) <= 2 else abs(error_pct(link["latency_ms"], latency_ms)))
        bandwidth_errors.append(abs(bw_err))
        rows.append(f"| {a} → {b} | {latency_ms:.0f} | {link['latency_ms']:.1f} | {lat_err:+.1f} | "
                    f"{bandwidth_mbps:.1f} | {link['bandwidth_mbps']:.1f} | {bw_err:+.1f} |")
    counts = snapshot["counts"]
    markdown = "\n".join([
        "## Link probe on emulated links",
        "",
        f"Command: `{command_line()}` — {len(SITES)} `hetswarm join` processes on 127.0.0.1, one per region of "
        f"`{args.scenario}`, bandwidth × {args.bandwidth_scale}; each pair measured once (by its lower peer id). "
        f"{counts['pairs_measured']} of {counts['pairs']} pairs measured, {elapsed:.0f} s from start to the last.",
        "",
        f"Latency error: median {statistics.median(latency_errors):.1f}, max {max(latency_errors):.1f} "
        "(ms where within 2 ms, else %); bandwidth error: median "
        f"{statistics.median(bandwidth_errors):.1f} %, max {max(bandwidth_errors):.1f} %. Target: 10 % (or 2 ms).",
        "",
        "| link | scenario ms | measured ms | error ms | scenario Mbit/s | measured Mbit/s | error % |",
        "|---|---|---|---|---|---|---|",
        *rows,
    ])
    write_section("probe", markdown)
    print(markdown)


if __name__ == "__main__":
    main()
