"""Health the coordinator acts on: a member that cannot reach a peer of the plan says so at once (its Progress
record), and the coordinator, once a second member or its own ping confirms it, re-plans without that peer long
before the peer's record expires (a report its ping contradicts leaves the reporter out instead); a member that
gave up gets the plan restarted from the last committed step.

The pure parts first (which reports count, what the replanner does with them), then the real thing on 127.0.0.1:
a coordinator and three clients (1 pipeline × 2 stages and a standby, records that live 60 s); the last stage is
SIGKILLed mid-training. Its neighbour's next send fails at once, the coordinator leaves it out and places the
standby, and training goes on under the new plan from the last committed step.
"""
from __future__ import annotations

import asyncio
import re
import time

import pytest
from hivemind.utils import get_dht_time

from hetswarm.client.local.swarm import LocalSwarm
from hetswarm.client.peer.hivemind_compat import load_identity
from hetswarm.coordinator.broadcaster import troubles
from hetswarm.coordinator.planner import PlannerConfig
from hetswarm.coordinator.replanner import Replanner
from hetswarm.coordinator.reports import ReportCheck
from hetswarm.coordinator.scheduling.search import SearchConfig
from hetswarm.protocol.identity import peer_id_of
from hetswarm.protocol.keys import ASSIGNMENT_FIELD, PEERS_FIELD, PROGRESS_FIELD
from hetswarm.protocol.model_config import get_model_config
from hetswarm.protocol.record_store import SwarmRecords
from hetswarm.protocol.records import Assignment, Progress
from tests.helpers.dht_nodes import start_node
from tests.helpers.plans import Publishing
from tests.helpers.swarm_records import IDS, link, record
from tests.helpers.waiting import wait_until

TINY = get_model_config("tiny")
PEERS = IDS[:3]
STRANGER = IDS[8]


def records_of(peers: list[str]) -> dict:
    return {p: record(p, links={q: link(10.0, 1000.0) for q in peers if q > p}) for p in peers}


def replanner_with_plan() -> tuple[Publishing, Assignment]:
    config = PlannerConfig(model=TINY, d_dp=1, d_pp=2, search=SearchConfig(time_budget_s=0.3), debounce_s=30)
    replanner = Publishing(Replanner(config))
    assert replanner.decide(records_of(PEERS), now=0.0) is None  # membership must hold for the debounce first
    proposal, _ = replanner.decide(records_of(PEERS), now=100.0) or (None, None)
    assert proposal is not None and len(proposal.plan.grid.ravel()) == 2
    return replanner, replanner.in_force.assignment


def report(peer: str, plan: Assignment, **fields) -> Progress:
    return Progress(peer_id=peer, assignment_version=plan.version, step=4, loss=None, tokens_per_s=0.0,
                    compute_s=0.0, wait_s=0.0, updated_at=get_dht_time(), **fields)


def test_only_members_reports_about_members_under_the_current_version_count():
    _, plan = replanner_with_plan()
    a, b = plan.pipelines[0]
    progress = {a: report(a, plan, health="retrying", unreachable=[b, STRANGER]),
                b: report(b, plan, health="stalled", reason="gave up"),
                STRANGER: report(STRANGER, plan, health="stalled", unreachable=[a])}
    unreachable, stalled = troubles(plan, progress)
    assert unreachable == {a: [b]} and stalled == {b: "gave up"}
    old = plan.copy(update={"version": 2})
    assert troubles(old, progress) == ({}, {})  # reports under another version say nothing about this plan


def test_an_unreachable_peer_is_planned_out_at_once_without_waiting_for_the_debounce():
    replanner, plan = replanner_with_plan()
    a, b = plan.pipelines[0]
    standby = (set(PEERS) - {a, b}).pop()
    assert replanner.decide(records_of(PEERS), now=101.0) is None  # nothing changed
    replanner.note_trouble(unreachable={a: [b]}, stalled={}, now=101.0)
    proposal, reason = replanner.decide(records_of(PEERS), now=101.5)  # b's record is still there
    assert b not in proposal.peers and {a, standby} <= set(proposal.view.peer_ids)
    assert "unreachable" in reason
    assert replanner.decide(records_of(PEERS), now=102.0) is None  # b stays out while suspected


def test_a_stalled_member_gets_the_same_plan_restarted_at_most_once_per_retry_period():
    replanner, plan = replanner_with_plan()
    a, b = plan.pipelines[0]
    replanner.note_trouble(unreachable={}, stalled={a: "commit unknown"}, now=101.0)
    proposal, reason = replanner.decide(records_of(PEERS), now=101.0)
    assert proposal.pipelines == plan.pipelines and reason.startswith("restart from the last committed step")
    replanner.note_trouble(unreachable={}, stalled={a: "commit unknown"}, now=102.0)
    assert replanner.decide(records_of(PEERS), now=102.0) is None  # within retry_s: no thrashing


def test_members_that_report_every_other_peer_unreachable_leave_nothing_to_plan_and_no_error():
    replanner, plan = replanner_with_plan()
    replanner.note_trouble(unreachable={a: [b for b in PEERS if b != a] for a in PEERS}, stalled={}, now=101.0)
    assert replanner.decide(records_of(PEERS), now=101.5) is None  # everyone is a suspect: nobody left to plan


def test_a_lone_report_counts_when_the_coordinators_ping_fails_too_and_turns_on_its_reporter_when_it_does_not():
    a, b, c, liar = IDS[:4]
    pinged: list[set[str]] = []

    async def silent(peers) -> set[str]:
        pinged.append(set(peers))
        return {b} & set(peers)  # b is gone; c answers

    check = ReportCheck(silent, coordinator_id=IDS[9], remember_s=60.0)
    judged = asyncio.run(check.judge({a: [b], liar: [c]}, 0.0))
    assert judged.unreachable == {a: [b], IDS[9]: [liar]} and pinged == [{b, c}]
    assert "answers the coordinator's ping" in judged.reasons[liar] and c not in judged.reasons
    assert asyncio.run(check.judge({a: [b], liar: [c]}, 30.0)) == judged and len(pinged) == 1  # remembered
    both = asyncio.run(check.judge({a: [c], liar: [c]}, 30.0))  # two members agree: no ping needed
    assert both.unreachable == {a: [c], liar: [c]} and len(pinged) == 1

    replanner, plan = replanner_with_plan()
    x, y = plan.pipelines[0]
    judged = asyncio.run(ReportCheck(_nobody_silent, coordinator_id=IDS[9], remember_s=60.0).judge({x: [y]}, 101.0))
    replanner.note_trouble(unreachable=judged.unreachable, stalled={}, now=101.0, reasons=judged.reasons)
    proposal, reason = replanner.decide(records_of(PEERS), now=101.5)
    assert x not in proposal.peers and y in proposal.peers  # the honest peer stays, the reporter is out
    assert "answers the coordinator's ping" in replanner.left_out(102.0)[x]


async def _nobody_silent(peers) -> set[str]:
    return set()


# ---- a placed client killed mid-training ----

SWARM = "healthtest"
CLIENT_TTL_S = 60.0  # the dead peer's record outlives the whole test: only the health report can explain a re-plan
COORDINATOR_ARGS = ("--model", "tiny", "--dp", "1", "--pp", "2", "--min-peers", "3", "--ttl", "20",
                    "--debounce", "1", "--measure-wait", "30", "--time-budget", "1", "--reconsider", "3600",
                    "--lost-state-wait", "0")
"""With one pipeline the killed stage has no other replica (and nobody keeps checkpoints here): its layers start
again from the seed at once (tests/test_state_survives.py has the swarm that keeps them)."""
CLIENTS = ("alice", "bob", "carol")
_JOINED_LINE = re.compile(r"Others can join with: --initial-peers (\S+)")


def read(dht, field: str) -> dict:
    return asyncio.run(SwarmRecords(dht, SWARM, timeout_s=10).read(field))


@pytest.fixture(scope="module")
def killed(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("health")
    with LocalSwarm(SWARM, workdir=tmp, preimported=True) as swarm:
        # the identities before the clients: a client that starts at once would make its own while we make ours
        ids = {peer_id_of(load_identity(tmp / f"{name}.key").get_public_key()): name for name in CLIENTS}
        swarm.start_coordinator("coordinator", *COORDINATOR_ARGS)
        clients = {name: swarm.start_client(name, "--coordinator", swarm.coordinator_id, "--ttl", str(CLIENT_TTL_S),
                                            "--torch-threads", "1") for name in CLIENTS}
        via = clients["alice"].wait_for(_JOINED_LINE, timeout_s=90).group(1)
        observer, _ = start_node(SWARM, tmp / "observer.key", [via])
        try:
            def training() -> tuple[Assignment, int] | None:
                plan = read(observer, ASSIGNMENT_FIELD).get(swarm.coordinator_id)
                steps = [r.step for p, r in read(observer, PROGRESS_FIELD).items()
                         if plan and p in plan.roles and r.assignment_version == plan.version]
                return (plan, max(steps)) if plan and len(steps) == 2 and min(steps) >= 3 else None

            before, last_step = wait_until("the plan to train a few steps", training, 180)
            victim = before.pipelines[0][1]  # the last stage: its neighbour's next send fails at once
            killed_at = time.monotonic()
            clients[ids[victim]].kill()  # SIGKILL, then waits (by PID) until its DHT process and p2pd are gone

            def replanned() -> Assignment | None:
                plan = read(observer, ASSIGNMENT_FIELD).get(swarm.coordinator_id)
                return plan if plan and plan.version > before.version else None

            after = wait_until("a plan without the killed peer", replanned, 60, interval_s=0.2)
            replanned_at = time.monotonic()
            victim_record_still_there = victim in read(observer, PEERS_FIELD)

            def trains_again() -> Progress | None:
                return next((r for p, r in read(observer, PROGRESS_FIELD).items() if p in after.roles
                             and r.assignment_version == after.version and r.health == "training"), None)

            first = wait_until("training under the new plan", trains_again, 60, interval_s=0.2)
            return {"before": before, "after": after, "victim": victim, "last_step": last_step,
                    "replan_s": replanned_at - killed_at, "resume_s": time.monotonic() - replanned_at,
                    "victim_record_still_there": victim_record_still_there, "first": first}
        finally:
            observer.shutdown()


@pytest.mark.timeout(300)
@pytest.mark.swarm
def test_a_peer_that_a_neighbour_cannot_reach_is_planned_out_before_its_record_expires(killed):
    after, victim = killed["after"], killed["victim"]
    assert victim not in after.roles and len(after.roles) == 2  # the standby took its place
    assert "start again from the seed" in after.reason and after.handoff.seeded_layers == [[2, 4]], after.reason
    assert "unreachable" in after.reason, after.reason
    assert killed["victim_record_still_there"] and killed["replan_s"] < CLIENT_TTL_S
    print(f"re-planned {killed['replan_s']:.1f} s after the kill; training again {killed['resume_s']:.1f} s later")


@pytest.mark.timeout(300)
@pytest.mark.swarm
def test_training_goes_on_from_the_last_committed_step_within_fifteen_seconds(killed):
    after = killed["after"]
    assert after.step > killed["last_step"]  # the last committed step, not 0
    assert killed["first"].step >= after.step
    assert killed["resume_s"] < 15.0
