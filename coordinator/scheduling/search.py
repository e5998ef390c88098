"""The project's evolutionary search over balanced partitions: a memetic algorithm on the true objective.

Like the DT-FM reference (docs/dtfm.md, The reference search) it evolves a population of partitions and improves
every offspring by local search, but: the local search minimises the real cost (not a proxy gain), it is evaluated
incrementally with cached terms, crossover keeps whole groups of one parent, the population starts from
structured seeds as well as random ones, it restarts when it stalls, and it stops on a generation count, a stall
or a time budget. One numpy Generator seeded from the config drives every random choice.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from hetswarm.coordinator.scheduling.cost_model import CostEvaluator
from hetswarm.coordinator.scheduling.neighbourhood import CachedEvaluator, Candidate, improve_by_swaps
from hetswarm.protocol.errors import ConfigError

__all__ = ["SearchConfig", "SearchProgress", "SearchResult", "search"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True, slots=True)
class SearchConfig:
    """How long and how widely to search. The same seed gives the same plan whenever the search ends on its
    generation or stall limit rather than on the time budget, which is a safety bound."""

    time_budget_s: float = 5.0
    """Wall-clock budget; the search returns its best plan when it runs out. With hardware, `find_plan` makes the
    whole plan within it (coordinator/scheduling/scheduler.py)."""
    seed: int = 0
    population: int = 12
    """Local optima kept: the structured seeds, `random_starts` random partitions, then mutated seeds."""
    random_starts: int = 2
    """Random partitions in each (re)started population, for diversity; local search from one is the costliest."""
    max_generations: int = 300
    """Offspring produced at most (each one crossed over, mutated and locally improved)."""
    stall_generations: int = 40
    """Offspring in a row without a new best before the population restarts (or, out of restarts, the search ends)."""
    restarts: int = 2
    """Times a stalled population is replaced by fresh random local optima, keeping the best so far."""
    mutation_swaps: int = 3
    """Random swaps applied to each offspring (1 to this many), so that it leaves its parents' basins."""
    moves_per_group_pair: int = 48
    """On swarms with more than 16 devices per group, swaps tried per pair of groups per local-search pass."""

    def __post_init__(self) -> None:
        if not self.time_budget_s > 0:
            raise ConfigError(f"time_budget_s must be positive, got {self.time_budget_s}")
        if self.population < 2:
            raise ConfigError(f"population must be at least 2, got {self.population}")
        for name in ("max_generations", "restarts", "random_starts", "mutation_swaps"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be non-negative, got {getattr(self, name)}")
        for name in ("stall_generations", "moves_per_group_pair"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be positive, got {getattr(self, name)}")


@dataclass(frozen=True, kw_only=True, slots=True)
class SearchProgress:
    """What the search reports as it goes (the CLI renders it)."""

    generation: int
    evaluations: int
    best_cost_s: float
    elapsed_s: float


@dataclass(frozen=True, kw_only=True, slots=True)
class SearchResult:
    best: Candidate
    evaluations: int
    """Candidates costed (full or incremental), the unit the reference's "5,000 candidates" counts in."""
    generations: int
    elapsed_s: float
    stopped_by: str
    """"time budget", "stall" or "generations"."""


def search(
    evaluator: CostEvaluator,
    config: SearchConfig,
    *,
    classes: np.ndarray | None = None,
    seeds: Sequence[np.ndarray] = (),
    progress: Callable[[SearchProgress], None] | None = None,
) -> SearchResult:
    """Finds a low-cost balanced partition of `evaluator.n_devices` devices into d_pp groups of d_dp.

    Args:
        classes: (N,) interchangeable-device class ids (Network.twin_classes); default: all devices distinct.
        seeds: (d_pp, d_dp) partitions to start from besides random ones (e.g. site-blocked and site-strided).
        progress: called after each generation and whenever the best improves.
    """
    start = time.perf_counter()
    deadline = start + config.time_budget_s
    rng = np.random.default_rng(config.seed)
    n, d_pp, d_dp = evaluator.n_devices, evaluator.d_pp, evaluator.d_dp
    classes = np.arange(n) if classes is None else np.asarray(classes)
    cached = CachedEvaluator(evaluator)
    moves = None if d_dp <= 16 else config.moves_per_group_pair

    def improve(partition: np.ndarray) -> Candidate:
        start_candidate = cached.candidate(partition)
        return improve_by_swaps(cached, start_candidate, classes, rng, deadline=deadline, max_moves_per_pair=moves)

    def report(generation: int) -> None:
        if progress is not None:
            progress(SearchProgress(generation=generation, evaluations=cached.evaluations,
                                    best_cost_s=best.cost_s, elapsed_s=time.perf_counter() - start))

    starts = [np.asarray(seed, dtype=np.int64).reshape(d_pp, d_dp) for seed in seeds]
    population = _fill(improve, starts, config, (d_pp, d_dp), rng, deadline)
    best = min(population, key=lambda c: c.score)
    report(0)
    generation, stall, restarts_left, stopped_by = 0, 0, config.restarts, "generations"
    while generation < config.max_generations:
        if time.perf_counter() >= deadline:
            stopped_by = "time budget"
            break
        if stall >= config.stall_generations:
            if not restarts_left:
                stopped_by = "stall"
                break
            restarts_left, stall = restarts_left - 1, 0
            logger.debug("search stalled at %.4f s after %d generations; restarting", best.cost_s, generation)
            population = [best] + _fill(improve, [best.partition], config, (d_pp, d_dp), rng, deadline)[1:]
        generation += 1
        first, second = (_tournament(population, rng) for _ in range(2))
        child_partition = _mutated(_crossover(first.partition, second.partition, rng), config.mutation_swaps, rng)
        child = improve(child_partition)
        if child.score < best.score:
            best, stall = child, 0
            logger.debug("generation %d: best %.4f s", generation, best.cost_s)
        else:
            stall += 1
        worst = max(range(len(population)), key=lambda index: population[index].score)
        if child.score < population[worst].score and child.signature() not in {c.signature() for c in population}:
            population[worst] = child
        report(generation)
    elapsed = time.perf_counter() - start
    logger.info("search: %.4f s after %d generations, %d evaluations, %.2f s (stopped by %s)",
                best.cost_s, generation, cached.evaluations, elapsed, stopped_by)
    return SearchResult(best=best, evaluations=cached.evaluations, generations=generation, elapsed_s=elapsed,
                        stopped_by=stopped_by)


def _fill(
    improve: Callable[[np.ndarray], Candidate],
    starts: list[np.ndarray],
    config: SearchConfig,
    shape: tuple[int, int],
    rng: np.random.Generator,
    deadline: float,
) -> list[Candidate]:
    """Distinct local optima from the starts, from random partitions, then from heavily mutated starts.

    Tiny swarms have fewer distinct optima than the population size; the attempts are bounded so that this ends.
    """
    population: list[Candidate] = []
    signatures: set = set()
    plan = list(starts) + [rng.permutation(shape[0] * shape[1]).reshape(shape) for _ in range(config.random_starts)]
    for attempt in range(len(plan) + 4 * config.population):
        if len(population) >= config.population or (population and time.perf_counter() >= deadline):
            break
        if attempt < len(plan):
            partition = plan[attempt]
        elif plan:
            partition = _mutated(plan[attempt % len(plan)], config.mutation_swaps * 2, rng)
        else:
            partition = rng.permutation(shape[0] * shape[1]).reshape(shape)
        candidate = improve(partition)
        if candidate.signature() not in signatures:
            signatures.add(candidate.signature())
            population.append(candidate)
    return population


def _tournament(population: list[Candidate], rng: np.random.Generator) -> Candidate:
    first, second = rng.choice(len(population), size=2, replace=len(population) < 2)
    return min(population[first], population[second], key=lambda c: c.score)


def _crossover(first: np.ndarray, second: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Keeps a random half of `first`'s groups whole; the other devices fill the rest in `second`'s grouping order."""
    d_pp, d_dp = first.shape
    kept = rng.choice(d_pp, size=max(1, d_pp // 2), replace=False)
    taken = np.zeros(first.size, dtype=bool)
    taken[first[kept].ravel()] = True
    rest = [device for device in second.ravel() if not taken[device]]
    return np.concatenate([first[kept].ravel(), np.array(rest, dtype=np.int64)]).reshape(d_pp, d_dp)


def _mutated(partition: np.ndarray, max_swaps: int, rng: np.random.Generator) -> np.ndarray:
    partition = partition.copy()
    d_pp, d_dp = partition.shape
    if d_pp < 2 or max_swaps == 0:
        return partition
    for _ in range(int(rng.integers(1, max_swaps + 1))):
        a, b = rng.choice(d_pp, size=2, replace=False)
        i, j = rng.integers(d_dp, size=2)
        partition[a, i], partition[b, j] = partition[b, j], partition[a, i]
    return partition
