"""The coordinator pings the peers a plan places before it publishes it, and plans again without those that do not
answer: a peer killed since its record was last refreshed is never placed on the strength of that record alone.

`unanswered` runs on real daemons in this process (a live prober, a daemon without the probe handler, a dead one, a
prober that answers late and gets a second chance);
the broadcaster's use of it runs on a real DHT node that holds the peers' signed records, with the pings stood in
for by the answer a dead peer gives (the real pings are the first test's). A node signs only its own records, so each peer's comes from a node of its
own.
"""
from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from hivemind.utils import get_dht_time

from hetswarm.client.peer.link_probe import ProbeServicer, unanswered
from hetswarm.coordinator.broadcaster import BroadcastConfig, Broadcaster
from hetswarm.coordinator.planner import PlannerConfig
from hetswarm.coordinator.replanner import Replanner
from hetswarm.coordinator.scheduling.search import SearchConfig
from hetswarm.protocol.identity import peer_id_of
from hetswarm.protocol.model_config import get_model_config
from hetswarm.protocol.record_store import SwarmRecords
from tests.helpers.dht_nodes import start_node
from tests.helpers.p2p_nodes import connected_p2ps
from tests.helpers.swarm_records import link, record

pytestmark = [pytest.mark.swarm, pytest.mark.timeout(90)]

SWARM = "pings"
NAMESPACE = "pings-test"


def test_a_dead_peer_and_a_peer_without_the_probe_handler_do_not_answer_a_live_one_does():
    async def scenario() -> tuple[set[str], dict[str, str]]:
        async with connected_p2ps(4) as (asker, live, bare, dead):
            await ProbeServicer(admits=lambda peer: False).add_p2p_handlers(live, namespace=NAMESPACE)
            names = {str(p2p.peer_id): name for p2p, name in ((live, "live"), (bare, "bare"), (dead, "dead"))}
            await dead.shutdown()
            return await unanswered(asker, set(names), namespace=NAMESPACE, timeout_s=5.0), names

    silent, names = asyncio.run(scenario())
    assert {names[peer] for peer in silent} == {"bare", "dead"}


def test_a_peer_that_answers_late_has_a_second_longer_chance_and_a_dead_one_stays_silent(monkeypatch):
    async def late_ping(self: ProbeServicer, request, context):
        await asyncio.sleep(1.0)  # a busy machine: 64 peers on 2 cores answered later than 5 s
        return await answer(self, request, context)

    answer = ProbeServicer.rpc_ping
    monkeypatch.setattr(ProbeServicer, "rpc_ping", late_ping)

    async def scenario() -> tuple[set[str], set[str], dict[str, str]]:
        async with connected_p2ps(3) as (asker, late, dead):
            await ProbeServicer(admits=lambda peer: True).add_p2p_handlers(late, namespace=NAMESPACE)
            names = {str(p2p.peer_id): name for p2p, name in ((late, "late"), (dead, "dead"))}
            await dead.shutdown()
            once = await unanswered(asker, set(names), namespace=NAMESPACE, timeout_s=0.3)
            twice = await unanswered(asker, set(names), namespace=NAMESPACE, timeout_s=0.3, again_s=5.0)
            return once, twice, names

    once, twice, names = asyncio.run(scenario())
    assert {names[peer] for peer in once} == {"late", "dead"}
    assert {names[peer] for peer in twice} == {"dead"}


SPEEDS = {"a": 1.0, "b": 0.5, "dead": 100.0}
"""Claimed TFLOPS: the 1 × 2 plan takes the two fastest, "a" and the dead one."""


def test_a_placed_peer_that_does_not_answer_is_left_out_of_the_published_plan(tmp_path: Path):
    node, coordinator_key = start_node(SWARM, tmp_path / "coordinator.key")
    maddrs = [str(m) for m in node.get_visible_maddrs()]
    peers = {name: start_node(SWARM, tmp_path / f"{name}.key", maddrs) for name in ("a", "b", "dead")}
    ids = {name: peer_id_of(key.get_public_key()) for name, (_, key) in peers.items()}
    asked: list[set[str]] = []

    async def silent(peers) -> set[str]:  # the dead peer's ping fails, as the first test shows a dead daemon's does
        asked.append(set(peers))
        return set(peers) & {ids["dead"]}

    async def scenario() -> Broadcaster:
        for name, (dht, key) in peers.items():  # each signed by its own node; the dead one claims to be the fastest
            links = {ids[other]: link(10, 1000) for other in ids if other != name}  # (on probation: as fast as "a"),
            fresh = record(ids[name], links=links, tflops=SPEEDS[name]).copy(  # so the first plan wants it
                update={"updated_at": get_dht_time()})
            assert await SwarmRecords(dht, SWARM, private_key=key).publish(fresh, ttl_s=60.0)
        planner = PlannerConfig(model=get_model_config("tiny"), d_dp=1, d_pp=2, min_peers=2, debounce_s=0.0,
                                measure_wait_s=0.0, search=SearchConfig(time_budget_s=0.5))
        broadcaster = Broadcaster(node, private_key=coordinator_key,
                                  coordinator_id=peer_id_of(coordinator_key.get_public_key()),
                                  replanner=Replanner(planner), config=BroadcastConfig(swarm=SWARM, interval_s=0.2),
                                  silent=silent)
        stop = asyncio.Event()
        task = asyncio.create_task(broadcaster.run(stop))
        async with asyncio.timeout(45):
            while broadcaster.published is None:
                await asyncio.sleep(0.2)
        stop.set()
        await asyncio.wait_for(task, 15)
        return broadcaster

    try:
        broadcaster = asyncio.run(scenario())
    finally:
        for dht, _ in peers.values():
            dht.shutdown()
        node.shutdown()
    assert asked and ids["dead"] in asked[0], asked  # it was placed first, and asked
    assert set(broadcaster.published.roles) == {ids["a"], ids["b"]}, broadcaster.published.roles
    assert all(ids["dead"] not in peers for peers in asked[1:])
