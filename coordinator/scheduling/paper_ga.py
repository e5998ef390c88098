"""The DT-FM paper's own search, re-implemented as a baseline (docs/dtfm.md, The reference search).

A steady-state memetic algorithm: 100 random permutations, then offspring by a "5-point crossover" (5 devices take
their group from parent 1, sizes repaired) improved by cyclic multi-way moves (Kernighan–Lin style) under the
reference's default gain, which looks only at pipeline link times. Candidates are costed exactly (the same inner
solvers as the project's search). Kept faithful, except for the reference's defects: it is seeded, and the
offspring replaces the worse parent when it is no worse than both (the reference effectively compared with parent 1).
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from hetswarm.coordinator.scheduling.cost_model import PaperCostModel
from hetswarm.coordinator.scheduling.neighbourhood import CachedEvaluator, Candidate
from hetswarm.coordinator.scheduling.search import SearchProgress

__all__ = ["PaperGAResult", "paper_ga"]


@dataclass(frozen=True, kw_only=True, slots=True)
class PaperGAResult:
    best: Candidate
    candidates: int
    """Candidates evaluated (the reference evaluates 5,000: 100 initial and 4,900 offspring)."""
    elapsed_s: float


def paper_ga(
    model: PaperCostModel,
    *,
    candidates: int = 5000,
    population: int = 100,
    seed: int = 0,
    time_budget_s: float | None = None,
    progress: Callable[[SearchProgress], None] | None = None,
) -> PaperGAResult:
    """Runs the reference's hybrid GA for `candidates` evaluations (or until the optional time budget)."""
    start = time.perf_counter()
    rng = np.random.default_rng(seed)
    cached = CachedEvaluator(model)
    n, d_pp, d_dp = model.n_devices, model.d_pp, model.d_dp
    labels = [np.repeat(np.arange(d_pp), d_dp)[rng.permutation(n)] for _ in range(min(population, candidates))]
    scored = [cached.candidate(_partition(label, d_pp)) for label in labels]
    best = min(scored, key=lambda c: c.cost_s)
    evaluated = len(scored)
    while evaluated < candidates and (time_budget_s is None or time.perf_counter() - start < time_budget_s):
        first, second = rng.integers(len(labels), size=2)
        crossed = _five_point_crossover(labels[first], labels[second], d_dp, rng)
        child_labels = _cyclic_partitioning(model.pp_edge_s, crossed, d_pp)
        child = cached.candidate(_partition(child_labels, d_pp))
        evaluated += 1
        if child.cost_s <= max(scored[first].cost_s, scored[second].cost_s):
            worse = first if scored[first].cost_s >= scored[second].cost_s else second
            labels[worse], scored[worse] = child_labels, child
        if child.cost_s < best.cost_s:
            best = child
        if progress is not None and evaluated % 100 == 0:
            progress(SearchProgress(generation=evaluated, evaluations=evaluated, best_cost_s=best.cost_s,
                                    elapsed_s=time.perf_counter() - start))
    return PaperGAResult(best=best, candidates=evaluated, elapsed_s=time.perf_counter() - start)


def _partition(labels: np.ndarray, d_pp: int) -> np.ndarray:
    """(d_pp, d_dp) device ids from a group label per device."""
    return np.stack([np.flatnonzero(labels == group) for group in range(d_pp)])


def _five_point_crossover(first: np.ndarray, second: np.ndarray, d_dp: int, rng: np.random.Generator) -> np.ndarray:
    """Five random devices take their group from `first`; overfull groups then hand devices (in device order) to
    the first group with room, as the reference repairs sizes."""
    child = second.copy()
    points = rng.permutation(len(child))[:5]
    child[points] = first[points]
    sizes = np.bincount(child, minlength=len(child) // d_dp)
    for device in range(len(child)):
        if sizes[child[device]] > d_dp:
            target = int(np.flatnonzero(sizes < d_dp)[0])
            sizes[child[device]] -= 1
            sizes[target] += 1
            child[device] = target
    return child


def _gains(edge_s: np.ndarray, labels: np.ndarray, locked: np.ndarray, d_pp: int) -> tuple[np.ndarray, np.ndarray]:
    """The reference's default gain, for each group's candidate device (the unlocked member with the cheapest
    link inside its own group): moving it to group g gains (mean link time to g) − (its cheapest own link).

    Returns:
        (device per group or -1, (d_pp, d_pp) gain of moving that device from group i to group g; -inf if none).
    """
    one_hot = labels[:, None] == np.arange(d_pp)[None, :]  # (N, d_pp)
    mean_to = (edge_s @ one_hot) / one_hot.sum(axis=0)  # (N, d_pp)
    same = labels[:, None] == labels[None, :]
    np.fill_diagonal(same, False)
    cheapest_own = np.where(same, edge_s, np.inf).min(axis=1)  # (N,)
    movers = np.full(d_pp, -1)
    gain = np.full((d_pp, d_pp), -np.inf)
    for group in range(d_pp):
        members = np.flatnonzero((labels == group) & ~locked)
        if len(members):
            mover = members[np.argmin(cheapest_own[members])]
            movers[group] = mover
            gain[group] = mean_to[mover] - cheapest_own[mover]
            gain[group, group] = -np.inf
    return movers, gain


def _cyclic_partitioning(edge_s: np.ndarray, labels: np.ndarray, d_pp: int) -> np.ndarray:
    """One pass of cyclic multi-way moves: up to d_pp cycles, each a chain of moves group → group that is closed
    back into its start group after its best prefix; the best prefix of cycles is kept (sizes stay balanced)."""
    locked = np.zeros(len(labels), dtype=bool)
    touched = np.zeros(d_pp, dtype=bool)
    snapshots, cycle_gains = [labels.copy()], [0.0]
    for _ in range(d_pp):
        current = snapshots[-1].copy()
        moves, gains, closing = [], [], []
        movers, gain = _gains(edge_s, current, locked, d_pp)
        start = group = int(np.argmax(gain.max(axis=1)))
        for _ in range(len(labels)):
            device, target = int(movers[group]), int(np.argmax(gain[group]))
            if device < 0:  # no unlocked device left here: send the last mover home
                device, target = moves[-1][0], start
            current[device] = target
            locked[device], touched[target] = True, True
            moves.append((device, group, target))
            gains.append(gain[group].max())
            closing.append(gain[group, start])
            group = target
            if group == start:
                break
            movers, gain = _gains(edge_s, current, locked, d_pp)
        prefix, prefix_gain = 0, 0.0
        for length in range(1, len(gains)):
            if sum(gains[:length]) + closing[length] > prefix_gain:
                prefix_gain, prefix = sum(gains[:length]) + closing[length], length
        for device, source, _ in moves[prefix + 1 :][::-1]:
            current[device] = source
        current[moves[prefix][0]] = start
        snapshots.append(current)
        cycle_gains.append(prefix_gain)
        if touched.all():
            break
    best_total, chosen = 0.0, 0
    for length in range(1, len(cycle_gains)):
        if sum(cycle_gains[:length]) > best_total:
            best_total, chosen = sum(cycle_gains[:length]), length - 1
    return snapshots[chosen]
