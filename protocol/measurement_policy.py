"""Which links a peer measures when the swarm is larger than its measurement budget.

Measuring every pair costs N−1 probes per peer; past a few dozen peers that is minutes of probing before the first
plan, and more links than a record may hold. So each peer keeps to a budget `k` of links, chosen in this order:

1. the peers the plan in force has it exchange with (its pipeline neighbours and its stage group), up to half the
   budget: the links the plan's price and its step depend on;
2. peers of its own site, up to a quarter of the budget: enough for the coordinator's estimate of the links
   within the site (coordinator/link_estimate.py), while a crowded site does not take the budget;
3. a random sample of the rest that rotates every epoch (one `reprobe_s`), so that, over time, measurements cover
   the swarm and the coordinator's estimates of the unmeasured links have something to stand on, as Petals'
   servers ping a few random candidates of the next blocks each round.

Within each rule peers are taken in the order of a number drawn from a hash of the pair and the epoch, so both ends
of a pair see the same draw, and the sample is symmetric: it takes a pair whose draw is below k / (N−1). The existing
rule — the peer with the smaller id measures — then holds without a message, and up to k+1 peers every pair is
drawn, which is the all-pairs measurement smaller swarms always had. Past the budget, a pair one end keeps and the
other drops (a cap cut it) is measured only if the smaller id keeps it, else estimated.
"""
from __future__ import annotations

import hashlib
from collections.abc import Collection, Mapping

from hetswarm.protocol.records import Assignment, PeerRecord
from hetswarm.protocol.stage_role import StageRole

__all__ = ["DEFAULT_MAX_LINKS", "FIRST_ROUND_SHARE", "expected_links", "links_to_measure", "pair_draw", "partners_in"]

DEFAULT_MAX_LINKS = 16
"""A volunteer's budget k unless it says otherwise (`hetswarm join --max-links`)."""
FIRST_ROUND_SHARE = 0.85
"""Of N·k/2, the pairs a swarm past k+1 peers has measured once each peer probed its first epoch's choice: the
policy yields ~95 % of that (a peer's rules and its sample draw fill its budget on average, not always;
benchmarks/measurement_budget.py: 7.6 probes per peer of k/2 = 8), less a margin for a thin draw (over 40 draws of
random ids at 18, 24, 32 and 64 peers, the fewest pairs measured were 92–95 % of N·k/2)."""


def pair_draw(a: str, b: str, epoch: int) -> float:
    """A number in [0, 1) that both ends of the pair compute alike for `epoch`, and that looks uniform."""
    low, high = sorted((a, b))
    digest = hashlib.sha256(f"{low}|{high}|{epoch}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def partners_in(plan: Assignment | None, me: str) -> frozenset[str]:
    """The peers `plan` has `me` exchange with (its neighbours and its stage group); none when it has no role."""
    if plan is None or me not in plan.roles:
        return frozenset()
    return StageRole.of(plan, me).partners


def links_to_measure(me: str, peers: Mapping[str, PeerRecord], *, site: str | None, partners: Collection[str],
                     budget: int, epoch: int) -> list[str]:
    """The peers of `peers` whose link with `me` is measured in `epoch`, at most `budget`, in the module
    docstring's order (within each rule, by the pair's draw)."""
    others = [peer for peer in peers if peer != me]
    draw = {peer: pair_draw(me, peer, epoch) for peer in others}
    share = min(1.0, budget / max(len(others), 1))
    by_draw = sorted(others, key=draw.__getitem__)
    chosen = [peer for peer in by_draw if peer in partners][:budget // 2]
    chosen += [peer for peer in by_draw if site is not None and peers[peer].site == site][:budget // 4]
    chosen += [peer for peer in by_draw if draw[peer] < share]
    return list(dict.fromkeys(chosen))[:budget]


def expected_links(n_peers: int, budget: int = DEFAULT_MAX_LINKS) -> int:
    """How many pairs of `n_peers` are measured once every peer has probed its first epoch's choice: every pair
    up to budget + 1 peers, else about FIRST_ROUND_SHARE of N·k/2 (each pair is probed by one end)."""
    pairs = n_peers * (n_peers - 1) // 2
    return pairs if n_peers <= budget + 1 else min(pairs, int(FIRST_ROUND_SHARE * n_peers * budget / 2))
