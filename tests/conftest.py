"""Shared fixtures: every child process a test starts is reaped, even when the test fails; golden runs are trained
once per session, whichever xdist worker asks first; one swarm serves the tests that only observe.

Under pytest-xdist (`--dist loadgroup`, see the Makefile) every test marked `swarm` runs in its module's group, so
that a module's swarm fixture is built once, on one worker, and the tests of the observed swarm run in a group of
their own; the groups go out slowest first, so that the two workers finish together.
"""
from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.golden_runs import SWARM_RUN, TINY_RUN, golden_results
from tests.helpers.processes import reap_children
from tests.helpers.shared_swarm import ObservedSwarm

SLOWEST_FIRST = ("test_state_survives", "test_coordinator_swarm", "test_loss_rollback", "test_hostile_swarm",
                 "test_attack_votes", "test_compressed_training", "test_step_faults", "test_run_ahead", "test_demo",
                 "test_trainer", "test_join_swarm", "observed_swarm", "test_training_correctness",
                 "test_coordinator_restart", "test_health_replan", "test_examples", "test_probe_backoff",
                 "test_orphans", "test_reachability")
"""Swarm modules (and the observed swarm's group) by the seconds they took, slowest first (benchmarks/RESULTS.md,
"Test suite"): the order in which xdist hands out their groups. A module not named here goes after them."""


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook names the items by their group
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _observes(item):
            item.add_marker(pytest.mark.xdist_group("observed_swarm"))
        elif item.get_closest_marker("swarm"):
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))
    rank = {name: i for i, name in enumerate(SLOWEST_FIRST)}

    def order(item: pytest.Item) -> tuple[int, bool]:
        group = "observed_swarm" if _observes(item) else item.module.__name__.rpartition(".")[2]
        return rank.get(group, len(rank)), _observes(item)  # the observed swarm's tests one after another

    items.sort(key=order)


def _observes(item: pytest.Item | None) -> bool:
    return item is not None and "observed_swarm" in getattr(item, "fixturenames", ())


@pytest.fixture(scope="session", autouse=True)
def _reap_leftover_children():
    yield
    reap_children()


@pytest.fixture(scope="session")
def shared_tmp(tmp_path_factory) -> Path:
    """A folder every xdist worker of this session sees (the session's own base folder without xdist)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture(scope="session")
def golden_tiny(shared_tmp: Path) -> list[dict]:
    """tests/helpers/golden_runs.py: TINY_RUN's per-process results, in peer order."""
    return golden_results(TINY_RUN, shared_tmp)


@pytest.fixture(scope="session")
def golden_swarm(shared_tmp: Path) -> list[dict]:
    """tests/helpers/golden_runs.py: SWARM_RUN's per-process results, in peer order."""
    return golden_results(SWARM_RUN, shared_tmp)


_observed: list[ObservedSwarm] = []
"""The observed swarm while it runs, for pytest_runtest_teardown to end it early."""


@pytest.fixture(scope="session")
def observed_swarm(tmp_path_factory) -> Iterator[ObservedSwarm]:
    """The shared read-only swarm (tests/helpers/shared_swarm.py)."""
    swarm = ObservedSwarm.start(tmp_path_factory.mktemp("observed"))
    _observed.append(swarm)
    yield swarm
    _end_observed()


@pytest.fixture(autouse=True)
def _observed_swarm_guard(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test that uses the observed swarm, directly or through a fixture, fails if it changed the swarm's plan or
    ended one of its processes."""
    yield
    if "observed_swarm" in request.fixturenames and _observed and (change := _observed[0].changes()):
        pytest.fail(f"this test changed the shared observed swarm, which other tests rely on: {change}")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None):
    """After the fixtures' teardown: the last test of the observed swarm ends it, so that its training does not load
    the rest of the run (its tests run one after another: see pytest_collection_modifyitems)."""
    yield
    if _observes(item) and not _observes(nextitem):
        _end_observed()


def _end_observed() -> None:
    while _observed:
        _observed.pop().close()


@pytest.fixture
def hetswarm_logger_restored():
    """Commands run in-process configure the `hetswarm` logger (a handler, no propagation); later tests get it
    back as it was, so that their caplog still sees hetswarm's records."""
    logger = logging.getLogger("hetswarm")
    saved = logger.handlers[:], logger.level, logger.propagate
    yield
    logger.handlers[:], logger.level, logger.propagate = saved
