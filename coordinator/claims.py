"""Claims checked against deeds: a peer's claimed TFLOPS against the compute time its Progress reports.

A peer's record claims a TFLOPS figure, and placement trusts it; a peer that claims 100× what it has would get a
stage it cannot keep up with, and slow every pipeline. Under a plan, each member reports the seconds its stage's
compute took per step, so the coordinator knows the FLOPs it did in that time (the live cost model's F_s·B/D_DP,
coordinator/scheduling/live_cost.py) and hence the TFLOPS it achieves. Training never reaches a matmul benchmark's peak,
so achieved/claimed (the peer's efficiency) is compared with the median efficiency of the plan's members. A peer
whose efficiency is off the median by more than `trust_band`, either way, is priced by what it does: at the TFLOPS
that would give it the median efficiency (a card throttled, shared or mis-probed computes unlike its figure), but
never, on its own reports alone, above what probation allows (below). One far below it (by more than `tolerance`)
claims more than it does. Either is flagged with both figures (the Refusals
record, the monitor). Within the band the claim stands: training time on a shared machine varies from step to step
and from stage to stage (fixed per-pass costs weigh more on a stage with fewer FLOPs), and a plan that followed that
noise would move peers for nothing. Like SWARM's throughput-based rebalancing (Ryabinin et al. 2023),
what is measured wins over what is said, once it says something clear.

A compute time no device could achieve (its stage's FLOPs at more than MAX_TFLOPS; 5e-324 s would price a peer as
infinitely fast) is not a measurement: it is left out, and the peer is flagged and priced at no more than the
median claim of the peers in view until it reports times a device can have.

A claim is on probation until its peer's neighbours confirm it: until then a claim more than `trust_band` times the
median claim of the peers in view is priced at that median, and flagged. A stranger that claims 10,000 TFLOPS among
the first peers of a swarm is therefore planned as an ordinary peer, not handed the whole model; claims within the
band (the same card, probed a little differently) stand. A peer's own compute times cannot confirm it: a liar
reports the times its claim implies. Its pipeline neighbours' clocks can. The upstream neighbour times each
micro-batch from its activations' send to its gradient's return (Progress.round_trip_s), and that interval holds the
member's forward and backward pass and the whole of the downstream neighbour's window on the micro-batch, from the
activations' arrival to its gradient's send (Progress.window_s), on the downstream neighbour's own clock. So the
member computed for at most round_trip(upstream) − window(downstream) per step (the medians of `min_reports`
steps), and achieves at least its stage's FLOPs in that time: neither figure is the member's to make. A claim is
confirmed when that floor reaches the swarm's median efficiency (from the members' own reports, which one liar
cannot move) divided by `trust_band`. A member of a first stage has no upstream neighbour to time it, and stays on
probation there: a plan that places it elsewhere can confirm it. An honest fast peer waits for its first few steps
(and the next reconsideration) to be planned at its speed.
"""
from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from hetswarm.coordinator.scheduling.live_cost import Execution, StageCosts
from hetswarm.protocol.limits import MAX_TFLOPS
from hetswarm.protocol.records import Assignment, PeerRecord, Progress

__all__ = ["ClaimCheck"]

KEPT_REPORTS = 10
"""Steps of each peer remembered; the median of them is its achieved TFLOPS."""


@dataclass
class _Timings:
    """A member's last Progress.window_s and round_trip_s under plan `version`."""

    KINDS: ClassVar[tuple[str, str]] = ("window_s", "round_trip_s")
    version: int
    window_s: list[float] = field(default_factory=list)
    round_trip_s: list[float] = field(default_factory=list)


@dataclass
class ClaimCheck:
    tolerance: float = 3.0
    """A peer whose efficiency is below the median efficiency divided by this claims more than it does."""
    trust_band: float = 2.0
    """A peer whose efficiency is off the median by more than this factor, either way, is priced by what it does."""
    min_reports: int = 3
    """Steps a peer must have reported before it is judged."""
    min_peers: int = 3
    """Peers with enough reports needed to form a median that one liar cannot move."""
    _achieved: dict[str, list[float]] = field(default_factory=dict)
    """Peer → TFLOPS it achieved in its last reported steps."""
    _counted: dict[str, tuple[int, int]] = field(default_factory=dict)
    """Peer → (plan version, step) of its last report counted, so that a record read twice counts once."""
    confirmed: frozenset[str] = frozenset()
    """The peers whose claims the last `judge` found their neighbours' timings had confirmed (module docstring)."""
    _impossible: dict[str, tuple[float, float]] = field(default_factory=dict)
    """Peer → (its last reported compute time, the least any device needs), when below it (module docstring)."""
    _timings: dict[str, _Timings] = field(default_factory=dict)
    """Peer → its last neighbour timings under the plan it follows (module docstring)."""
    _shown: dict[str, float] = field(default_factory=dict)
    """Peer → the TFLOPS its neighbours' timings show it achieves at least, as last shown (module docstring)."""

    def observe(self, plan: Assignment, progress: Mapping[str, Progress]) -> None:
        """Takes in the members' new step reports under `plan`."""
        try:
            model = plan.model_config()
        except (TypeError, ValueError):
            return
        execution = Execution.of_assignment(plan)
        costs = StageCosts.of(model, execution, d_dp=plan.d_dp)
        flops = costs.at(costs.flops, execution.layer_counts)  # (d_pp,) per step and pipeline, as the plan cuts
        for signer, record in progress.items():
            role = plan.roles.get(signer)
            if (role is None or signer != record.peer_id or record.assignment_version != plan.version
                    or record.health != "training" or self._counted.get(signer) == (plan.version, record.step)):
                continue
            self._counted[signer] = (plan.version, record.step)
            self._note_timings(plan.version, signer, record)
            if record.compute_s <= 0:
                continue
            floor_s = float(flops[role.stage]) / (MAX_TFLOPS * 1e12)
            if record.compute_s < floor_s:
                self._impossible[signer] = (record.compute_s, floor_s)
                continue
            self._impossible.pop(signer, None)
            achieved = self._achieved.setdefault(signer, [])
            achieved.append(float(flops[role.stage]) / record.compute_s / 1e12)
            del achieved[:-KEPT_REPORTS]
        self._corroborate(plan, flops)

    def _note_timings(self, version: int, peer: str, record: Progress) -> None:
        timings = self._timings.get(peer)
        if timings is None or timings.version != version:
            timings = self._timings[peer] = _Timings(version)
        for name in _Timings.KINDS:
            if (value := getattr(record, name)) is not None:
                kept = getattr(timings, name)
                kept.append(value)
                del kept[:-KEPT_REPORTS]

    def _corroborate(self, plan: Assignment, flops: np.ndarray) -> None:
        """The TFLOPS each member's neighbours show it achieves at least (module docstring)."""
        for chain in plan.pipelines:
            for stage in range(1, len(chain)):
                round_trip = self._timed(chain[stage - 1], plan.version, "round_trip_s")
                window = self._timed(chain[stage + 1], plan.version, "window_s") if stage + 1 < len(chain) else 0.0
                if round_trip is not None and window is not None and round_trip > window:
                    self._shown[chain[stage]] = float(flops[stage]) / (round_trip - window) / 1e12

    def _timed(self, peer: str, version: int, kind: str) -> float | None:
        """The median of `peer`'s last timings of `kind` under plan `version`, once it reported `min_reports`."""
        timings = self._timings.get(peer)
        kept = getattr(timings, kind) if timings is not None and timings.version == version else []
        return statistics.median(kept) if len(kept) >= self.min_reports else None

    def judge(self, records: Mapping[str, PeerRecord]) -> tuple[dict[str, PeerRecord], dict[str, str]]:
        """The records with each flagged peer's TFLOPS replaced by what it does (or capped while on probation), and
        why each was flagged."""
        judged, flagged = self._impossibly_fast(records)
        efficiency = self._efficiency(records)
        typical = statistics.median(efficiency.values()) if efficiency else 0.0
        self.confirmed = frozenset(peer for peer in efficiency if self.trust_band * self._shown.get(peer, 0.0)
                                   >= typical * records[peer].hardware.tflops)
        for peer, own in efficiency.items():
            ratio = own / typical
            if 1 / self.trust_band <= ratio <= self.trust_band:
                continue
            claimed = records[peer].hardware.tflops
            priced = claimed * ratio
            hardware = records[peer].hardware.copy(update={"tflops": priced})
            judged[peer] = records[peer].copy(update={"hardware": hardware})
            if ratio * self.tolerance < 1:
                flagged[peer] = (f"claims {claimed:.3g} TFLOPS but computes like {priced:.3g} "
                                 f"({1 / ratio:.0f}× below the swarm's efficiency); priced by what it does")
            else:
                flagged[peer] = (f"computes like {priced:.3g} TFLOPS, not the {claimed:.3g} it claims "
                                 f"({_times(ratio)} the swarm's efficiency); priced by what it does")
        self._on_probation(records, self.confirmed, judged, flagged)
        return judged, flagged

    def _efficiency(self, records: Mapping[str, PeerRecord]) -> dict[str, float]:
        """Each judged peer's achieved/claimed TFLOPS: peers with `min_reports` reports, once `min_peers` have them
        (else none)."""
        efficiency = {peer: statistics.median(done) / records[peer].hardware.tflops
                      for peer, done in self._achieved.items()
                      if len(done) >= self.min_reports and peer in records and records[peer].hardware.tflops > 0}
        return efficiency if len(efficiency) >= self.min_peers else {}

    def _on_probation(self, records: Mapping[str, PeerRecord], confirmed: frozenset[str],
                      judged: dict[str, PeerRecord], flagged: dict[str, str]) -> None:
        """Caps, in `judged`, the TFLOPS of every peer that is not `confirmed` and priced over `trust_band` times the
        median claim, at that median (module docstring), flagging them: whether its claim says so or its own compute
        reports, which priced it above its claim (a liar reports what suits it)."""
        if not records:
            return
        median_claim = statistics.median(record.hardware.tflops for record in records.values())
        for peer, record in records.items():
            claimed, priced = record.hardware.tflops, judged[peer].hardware.tflops
            if peer in confirmed or priced <= self.trust_band * median_claim:
                continue
            judged[peer] = record.copy(update={"hardware": record.hardware.copy(update={"tflops": median_claim})})
            own = f", {priced:.3g} by its own reports" if priced != claimed else ""
            flagged[peer] = (f"on probation: claims {claimed:.3g} TFLOPS{own}, priced at the median claim "
                             f"{median_claim:.3g} until its neighbours' timings confirm it")

    def _impossibly_fast(self, records: Mapping[str, PeerRecord]) -> tuple[dict[str, PeerRecord], dict[str, str]]:
        """The records with the TFLOPS of each peer whose reports no device could make capped at the median claim,
        and why each is flagged."""
        judged, flagged = dict(records), {}
        if not (liars := [peer for peer in self._impossible if peer in records]):
            return judged, flagged
        median_claim = statistics.median(record.hardware.tflops for record in records.values())
        for peer in liars:
            hardware = records[peer].hardware
            judged[peer] = records[peer].copy(update={"hardware": hardware.copy(
                update={"tflops": min(hardware.tflops, median_claim)})})
            reported_s, floor_s = self._impossible[peer]
            flagged[peer] = (f"reports {reported_s:.3g} s of compute for a step that takes {floor_s:.3g} s even at "
                             f"{MAX_TFLOPS:g} TFLOPS, beyond any device; priced at no more than the median claim, "
                             f"{median_claim:.3g}")
        return judged, flagged


def _times(ratio: float) -> str:
    return f"{ratio:.1f}× above" if ratio > 1 else f"{1 / ratio:.1f}× below"
