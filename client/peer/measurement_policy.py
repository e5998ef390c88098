"""Which links a peer measures when the swarm is larger than its measurement budget.

Measuring every pair costs N−1 probes per peer; past a few dozen peers that is minutes of probing before the first
plan, and more links than a record may hold. So each peer keeps to a budget `k` of links, chosen in this order:

1. the peers the plan in force has it exchange with (its pipeline neighbours and its stage group), up to half the
   budget: the links the plan's price and its step depend on;
2. peers of its own site, up to a quarter of the budget: enough for the coordinator's estimate of the site's
   links (the median of those measured, coordinator/swarm_view.py), while a crowded site does not take the budget;
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

__all__ = ["links_to_measure", "pair_draw", "partners_in"]


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
