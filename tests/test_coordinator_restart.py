"""Training never stalls on the coordinator: the step belongs to the plan, and a restarted coordinator goes on.

The pure parts first: the start step of a new plan counts only the current plan's members (a stranger's Progress
with step 10**12 is ignored) and never goes back; the state file round-trips and refuses another identity's; the
replanner adopts a previous run's plan as it is, or replans around the peers that left; a client says once that it
ignores an older version; `hetswarm coordinator` refuses to start a swarm of its own unless told --new-swarm.

Then the real thing, as processes on 127.0.0.1: a coordinator with an identity file and two training clients; the
coordinator is SIGKILLed mid-training and, once its assignment expired from the DHT, restarted with the same
identity. It publishes a higher version with the same roles, from the step the clients had reached, and they follow.
"""
from __future__ import annotations

import asyncio
import json
import logging
import re

import pytest
from hivemind.utils import get_dht_time
from typer.testing import CliRunner

from hetswarm.client.cli.app import app
from hetswarm.client.local.swarm import LocalSwarm
from hetswarm.client.peer.addresses import LOOPBACK
from hetswarm.client.peer.assignment_follower import AssignmentFollower
from hetswarm.client.peer.hivemind_compat import load_identity
from hetswarm.coordinator.plan_in_force import PlanInForce
from hetswarm.coordinator.planner import PlannerConfig
from hetswarm.coordinator.replanner import Replanner
from hetswarm.coordinator.run_state import (
    CoordinatorState,
    load_state,
    save_state,
    standing,
    start_step,
    state_path_for,
)
from hetswarm.coordinator.scheduling.search import SearchConfig
from hetswarm.protocol.errors import HetswarmError
from hetswarm.protocol.identity import peer_id_of
from hetswarm.protocol.keys import ASSIGNMENT_FIELD, PEERS_FIELD, PROGRESS_FIELD
from hetswarm.protocol.limits import MAX_STEP
from hetswarm.protocol.model_config import get_model_config
from hetswarm.protocol.record_store import SwarmRecords
from hetswarm.protocol.records import Assignment, Health, Progress
from tests.helpers.dht_nodes import start_node
from tests.helpers.plans import COORDINATOR, PEERS, Publishing, measured_records, plan
from tests.helpers.swarm_records import IDS
from tests.helpers.waiting import wait_until

TINY = get_model_config("tiny")
SEARCH = SearchConfig(time_budget_s=0.5)
STRANGER = IDS[8]


def progress(peer: str, *, version: int, step: int, health: Health = "training") -> Progress:
    return Progress(peer_id=peer, assignment_version=version, step=step, loss=None, tokens_per_s=1.0,
                    compute_s=0.1, wait_s=0.0, health=health, updated_at=get_dht_time())


# ---- the step belongs to the plan ----

def test_a_new_plan_starts_after_the_last_step_all_its_surviving_members_applied_and_strangers_do_not_count():
    current = plan(version=7, step=5)
    a, b, c, _ = sorted(current.roles)
    reports = {
        a: progress(a, version=7, step=9),
        b: progress(b, version=7, step=8),
        c: progress(c, version=6, step=50),  # a member's record of the previous plan says nothing about this one
        STRANGER: progress(STRANGER, version=7, step=MAX_STEP),  # not a member: ignored, however far it claims
    }
    assert start_step(current, reports) == 9  # every member applied step 8 (a also 9); the plan trains its `step` first
    assert start_step(current, reports, alive={a, c}) == 10  # b is gone: a's step 9 is the one the survivors hold
    stuck = {a: progress(a, version=7, step=9, health="retrying"), b: progress(b, version=7, step=9)}
    assert start_step(current, stuck) == 9  # a is stuck at step 9: it applied 8 only


def test_the_start_step_never_goes_back():
    current = plan(version=7, step=5)
    assert start_step(current, {}) == 5  # nothing reported yet: the plan's own start
    assert start_step(current, {}, remembered=12) == 12  # the members' records expired: what was remembered
    member = next(iter(current.roles))
    assert start_step(current, {member: progress(member, version=7, step=3)}, remembered=12) == 12
    assert start_step(None, {STRANGER: progress(STRANGER, version=1, step=99)}) == 0  # no plan: nobody counts


def test_a_record_filed_under_another_signer_does_not_count():
    current = plan(version=7, step=5)
    member = next(iter(current.roles))
    assert start_step(current, {STRANGER: progress(member, version=7, step=40)}) == 5


# ---- what a restarted coordinator keeps ----

def test_the_state_file_round_trips_and_is_written_whole(tmp_path):
    path = state_path_for(tmp_path / "coordinator.key")
    assert path == tmp_path / "coordinator.key.state.json"
    state = CoordinatorState(coordinator_id=COORDINATOR, version=7, step=12,
                             plan=PlanInForce(assignment=plan(version=7), origin="recovered"))
    save_state(path, state)
    assert load_state(path, COORDINATOR) == state
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary file left behind


def test_a_missing_broken_or_foreign_state_file_is_not_used(tmp_path, caplog):
    path = tmp_path / "coordinator.key.state.json"
    assert load_state(path, COORDINATOR) is None
    save_state(path, CoordinatorState(coordinator_id=STRANGER, version=3))
    with caplog.at_level(logging.WARNING):
        assert load_state(path, COORDINATOR) is None
        path.write_text(json.dumps({"coordinator_id": COORDINATOR, "version": "many", "step": 0, "assignment": None}))
        assert load_state(path, COORDINATOR) is None
        path.write_text("{")
        assert load_state(path, COORDINATOR) is None
    assert f"it belongs to {STRANGER}" in caplog.text and caplog.text.count("Ignored the coordinator state") == 3


def test_a_previous_plan_holds_while_one_of_its_peers_follows_it():
    previous = plan(version=7)
    assert standing(previous, measured_records(PEERS, following=7)) == "in force"
    assert standing(previous, measured_records(PEERS, following=9)) == "superseded"
    assert standing(previous, measured_records(PEERS, following=None)) == "abandoned"  # restarted: weights gone
    assert standing(previous, measured_records([STRANGER], following=7)) == "abandoned"  # not its peer


# ---- the replanner adopts instead of reshuffling ----

def test_an_adopted_plan_is_published_as_it_is_at_once():
    previous = plan(version=7)
    replanner = Replanner(PlannerConfig(model=TINY, d_pp=2, search=SEARCH, min_peers=8, debounce_s=5.0))
    assert replanner.fits(previous)
    planner = Publishing(replanner, PlanInForce(assignment=previous, origin="adopting"))
    proposal, reason = planner.decide(measured_records(PEERS, following=7), now=0.0)  # no debounce, no min_peers
    assert reason == "adopted plan v7 after a coordinator restart"
    assert proposal.pipelines == previous.pipelines
    assert planner.decide(measured_records(PEERS, following=7), now=1.0) is None  # and then kept


def test_a_plan_for_another_model_or_shape_is_not_adopted():
    previous = plan(version=7, d_dp=2, d_pp=2)
    assert not Replanner(PlannerConfig(model=get_model_config("small"), search=SEARCH)).fits(previous)
    assert not Replanner(PlannerConfig(model=TINY, d_pp=4, search=SEARCH)).fits(previous)
    assert not Replanner(PlannerConfig(model=TINY, d_dp=1, search=SEARCH)).fits(previous)


def test_when_a_peer_of_the_adopted_plan_left_the_survivors_are_replanned_after_the_debounce():
    previous = plan(version=7)
    gone = previous.pipelines[0][0]
    survivors = [p for p in PEERS if p != gone] + [IDS[4]]
    replanner = Replanner(PlannerConfig(model=TINY, d_pp=2, search=SEARCH, debounce_s=5.0))
    assert replanner.fits(previous)
    planner = Publishing(replanner, PlanInForce(assignment=previous, origin="adopting"))
    records = measured_records(survivors, following=7)
    assert planner.decide(records, now=0.0) is None
    assert planner.decide(records, now=4.0) is None
    proposal, reason = planner.decide(records, now=5.0)
    assert reason.startswith("membership changed since v7: 1 joined") and f"1 left […{gone[-6:]}]" in reason
    assert gone not in proposal.peers and len(proposal.view.peer_ids) == 4


# ---- the client's side ----

def test_a_client_says_once_per_version_that_it_ignores_an_older_one(caplog):
    me = PEERS[0]
    follower = AssignmentFollower(COORDINATOR, me)
    follower.consider({COORDINATOR: plan(version=7)})
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            assert follower.consider({COORDINATOR: plan(version=2)}) is None
        assert follower.consider({COORDINATOR: plan(version=7)}) is None  # the same version refreshed: normal
    assert caplog.text.count("Ignored assignment v2 from the pinned coordinator: older than v7") == 1
    assert "v7 from" not in caplog.text and follower.current.version == 7



@pytest.mark.timeout(60)
def test_a_coordinator_without_initial_peers_needs_new_swarm(hetswarm_logger_restored, tmp_path):
    """Else a coordinator restarted without --initial-peers would plan a swarm of its own, unseen by its clients."""
    result = CliRunner().invoke(app, ["coordinator", "--host-maddrs", LOOPBACK,
                                      "--identity-path", str(tmp_path / "coordinator.key")])
    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, HetswarmError), repr(result.exception)
    assert "give --initial-peers" in str(result.exception) and "--new-swarm" in str(result.exception)
    assert list(tmp_path.iterdir()) == []  # refused before anything started


# ---- a coordinator killed mid-training, and restarted ----

SWARM = "restarttest"
TTL_S = 10.0
COORDINATOR_ARGS = ("--model", "tiny", "--dp", "1", "--pp", "2", "--min-peers", "2", "--ttl", str(TTL_S),
                    "--debounce", "1", "--measure-wait", "20", "--time-budget", "1", "--reconsider", "3600")
CLIENTS = ("alice", "bob")
STEPS_BEFORE_KILL = 3
_JOINED_LINE = re.compile(r"Others can join with: --initial-peers (\S+)")


def read(dht, field: str) -> dict:
    return asyncio.run(SwarmRecords(dht, SWARM, timeout_s=10).read(field))


@pytest.fixture(scope="module")
def restart(tmp_path_factory) -> dict:
    """Runs the scenario once; the tests below read what it saw."""
    tmp = tmp_path_factory.mktemp("restart")
    with LocalSwarm(SWARM, workdir=tmp, preimported=True) as swarm:
        ids = {name: peer_id_of(load_identity(tmp / f"{name}.key").get_public_key()) for name in CLIENTS}
        first = swarm.start_coordinator("coordinator", *COORDINATOR_ARGS)
        coordinator_id = swarm.coordinator_id
        clients = [swarm.start_client(name, "--coordinator", coordinator_id, "--ttl", str(TTL_S), "--seed", "0",
                                      "--torch-threads", "1") for name in CLIENTS]
        via_client = clients[0].wait_for(_JOINED_LINE, timeout_s=90).group(1)  # outlives the coordinator
        observer, _ = start_node(SWARM, tmp / "observer.key", [via_client])
        try:
            def trained_a_few_steps() -> tuple[Assignment, int] | None:
                ours = read(observer, ASSIGNMENT_FIELD).get(coordinator_id)
                if ours is None:
                    return None
                steps = [r.step for p, r in read(observer, PROGRESS_FIELD).items()
                         if p in ours.roles and r.assignment_version == ours.version]
                return (ours, max(steps)) if len(steps) == len(CLIENTS) and min(steps) >= STEPS_BEFORE_KILL else None

            before, last_step_before = wait_until("both clients to train a few steps", trained_a_few_steps, 150)
            first.kill()  # SIGKILL by PID, and its DHT child and p2pd: nothing says goodbye
            wait_until("the killed coordinator's assignment to expire from the DHT",
                       lambda: coordinator_id not in read(observer, ASSIGNMENT_FIELD), TTL_S + 15)
            restarted = swarm.start("coordinator-restarted", "coordinator", "--initial-peers", via_client,
                                    "--host-maddrs", LOOPBACK, "--swarm", SWARM,
                                    "--identity-path", str(tmp / "coordinator.key"), *COORDINATOR_ARGS)
            restarted.wait_for(re.compile(f"Coordinator peer id: {coordinator_id}"), timeout_s=60)

            def followed() -> Assignment | None:
                ours = read(observer, ASSIGNMENT_FIELD).get(coordinator_id)
                if ours is None or ours.version <= before.version:
                    return None
                peers = read(observer, PEERS_FIELD)
                return ours if all(peers.get(i) and peers[i].assignment_version == ours.version
                                   for i in ids.values()) else None

            after = wait_until("the clients to follow the restarted coordinator", followed, 90)

            def trains_on() -> dict[str, Progress] | None:
                reports = {p: r for p, r in read(observer, PROGRESS_FIELD).items()
                           if p in ids.values() and r.assignment_version == after.version}
                return reports if len(reports) == len(CLIENTS) else None

            reports_after = wait_until("the clients to train under the new version", trains_on, 60)
            return {"before": before, "after": after, "last_step_before": last_step_before, "ids": ids,
                    "reports_after": reports_after, "log": restarted.output(),
                    "state": json.loads(state_path_for(tmp / "coordinator.key").read_text())}
        finally:
            observer.shutdown()


@pytest.mark.timeout(240)
@pytest.mark.swarm
def test_a_restarted_coordinator_publishes_a_higher_version_that_the_clients_follow(restart):
    assert restart["after"].version > restart["before"].version
    assert restart["state"]["version"] >= restart["after"].version  # and keeps counting in its state file


@pytest.mark.timeout(240)
@pytest.mark.swarm
def test_a_restarted_coordinator_goes_on_from_the_last_committed_step_with_the_same_roles(restart):
    before, after = restart["before"], restart["after"]
    assert after.step > restart["last_step_before"] >= STEPS_BEFORE_KILL  # not from 0
    assert after.roles == before.roles and after.pipelines == before.pipelines  # adopted, not reshuffled
    assert after.reason == f"adopted plan v{before.version} after a coordinator restart"
    assert f"Adopting plan v{before.version}" in restart["log"]
    assert all(r.step >= after.step for r in restart["reports_after"].values()), restart["reports_after"]
