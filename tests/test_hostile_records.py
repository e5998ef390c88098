"""Hostile records on real DHT nodes: implausible figures, records that would live for ever or come from the future,
Sybil floods, strangers' claims, and closed swarms. Every node refuses the first two; readers bound the third; the
coordinator's pure rules ignore the fourth and admit only the peers the operator chose."""
from __future__ import annotations

import asyncio
import math
import subprocess
import sys

import pytest
from hivemind.utils import get_dht_time

from hetswarm.client.peer.hivemind_compat import load_identity
from hetswarm.coordinator.admission import Admission, load_allow_list
from hetswarm.coordinator.broadcaster import BroadcastConfig, Broadcaster
from hetswarm.coordinator.planner import PlannerConfig
from hetswarm.coordinator.replanner import Replanner
from hetswarm.coordinator.run_state import highest_followed_version
from hetswarm.protocol.errors import ConfigError
from hetswarm.protocol.identity import peer_id_of
from hetswarm.protocol.join_tokens import issue_token, token_is_valid
from hetswarm.protocol.keys import PEERS_FIELD, dht_key
from hetswarm.protocol.limits import MAX_RECORD_TTL_S, MAX_STEP
from hetswarm.protocol.model_config import get_model_config
from hetswarm.protocol.record_store import SwarmRecords, encode_record, owner_subkey
from tests.helpers.dht_nodes import dht_pair, peers_seen_by, start_node, store_raw
from tests.helpers.swarm_records import make_record
from tests.helpers.tiny_training import assignment_for

SWARM = "sectest"
pytestmark = pytest.mark.timeout(180)


def _link(**figures) -> dict:
    return {"latency_ms": 10.0, "bandwidth_mbps": 100.0, "measured_at": get_dht_time(), "samples": 3} | figures


IMPLAUSIBLE = {
    "infinite bandwidth": lambda r: r["links"].update({"Qm" + "a" * 44: _link(bandwidth_mbps=math.inf)}),
    "NaN latency": lambda r: r["links"].update({"Qm" + "a" * 44: _link(latency_ms=math.nan)}),
    "a petaflop GPU": lambda r: r["hardware"].update(tflops=1e6),
    "negative memory": lambda r: r["hardware"].update(memory_gib=-1.0),
    "an infinite timestamp": lambda r: r.update(updated_at=math.inf),
    "a plan version past the limit": lambda r: r.update(assignment_version=MAX_STEP + 1),
}


@pytest.mark.swarm
def test_records_with_implausible_figures_are_refused_by_every_node(tmp_path):
    with dht_pair(SWARM, tmp_path) as ((dht_a, key_a), (dht_b, key_b)):
        id_a, id_b = peer_id_of(key_a.get_public_key()), peer_id_of(key_b.get_public_key())

        async def scenario() -> tuple[dict[str, bool], dict]:
            assert await SwarmRecords(dht_a, SWARM, private_key=key_a).publish(make_record(id_a), ttl_s=30)
            accepted = {}
            for what, spoil in IMPLAUSIBLE.items():
                value = encode_record(make_record(id_b, name="attacker"))
                spoil(value)
                accepted[what] = await store_raw(dht_b, SWARM, value, owner_subkey(key_b))
            return accepted, await peers_seen_by(dht_a, SWARM)

        accepted, seen = asyncio.run(scenario())
        assert not any(accepted.values()), accepted
        assert set(seen) == {id_a}  # the honest record stays, no attacker's record got in


@pytest.mark.swarm
def test_a_record_can_neither_outlive_the_cap_nor_come_from_the_future(tmp_path):
    with dht_pair(SWARM, tmp_path) as ((dht_a, _), (dht_b, key_b)):
        id_b = peer_id_of(key_b.get_public_key())

        async def store(value: dict, expires_in_s: float) -> bool:
            return await dht_b.store(dht_key(SWARM, PEERS_FIELD), value, get_dht_time() + expires_in_s,
                                     subkey=owner_subkey(key_b), return_future=True)

        async def scenario() -> tuple[bool, bool, bool, bool, dict]:
            record = encode_record(make_record(id_b))
            forever = await store(record, 10 * 365 * 86400.0)
            future = await store(record | {"updated_at": get_dht_time() + 3600.0}, 30.0)
            stale = await store(record | {"updated_at": get_dht_time() - 2 * MAX_RECORD_TTL_S}, 30.0)
            fine = await store(record, MAX_RECORD_TTL_S)
            return forever, future, stale, fine, await peers_seen_by(dht_a, SWARM)

        forever, future, stale, fine, seen = asyncio.run(scenario())
        assert not forever and not future and not stale
        assert fine and set(seen) == {id_b}


@pytest.mark.swarm
def test_a_reader_takes_a_bounded_number_of_records_the_plans_peers_first_then_the_freshest(tmp_path):
    """A Sybil flood in small: 6 identities (each its own node, as each signs its own record) publish; a reader
    that takes 4 keeps the 2 planned peers and the 2 newcomers that just refreshed their 60-s records, not the 2
    Sybils that stored records dated 10 minutes ago for the longest life a node accepts (by expiry they would
    come first)."""
    first, first_key = start_node(SWARM, tmp_path / "sybil0.key")
    nodes = [(first, first_key)]
    try:
        initial = [str(m) for m in first.get_visible_maddrs()]
        nodes += [start_node(SWARM, tmp_path / f"sybil{i}.key", initial) for i in range(1, 6)]
        ids = [peer_id_of(key.get_public_key()) for _, key in nodes]
        sybils = ids[:2]

        async def scenario() -> dict:
            for (dht, key), peer in zip(nodes, ids):
                record, ttl_s = make_record(peer), 60.0
                if peer in sybils:
                    record, ttl_s = record.copy(update={"updated_at": record.updated_at - 600}), 3000.0
                assert await SwarmRecords(dht, SWARM, private_key=key).publish(record, ttl_s=ttl_s)
            return await SwarmRecords(first, SWARM, max_records=4).read(PEERS_FIELD, prefer=ids[4:])

        seen = asyncio.run(scenario())
    finally:
        for dht, _ in nodes:
            dht.shutdown()
    assert set(seen) == set(ids[2:])


def test_a_claim_of_a_huge_plan_version_does_not_move_the_coordinators_versions():
    member, liar, stranger = "Qm" + "m" * 44, "Qm" + "n" * 44, "Qm" + "s" * 44
    plan = assignment_for([[member], [liar]], "Qm" + "c" * 44).copy(update={"version": 7})
    records = {member: make_record(member).copy(update={"assignment_version": 8}),  # one past ours: taken
               liar: make_record(liar).copy(update={"assignment_version": MAX_STEP}),  # a member's lie: ignored
               stranger: make_record(stranger).copy(update={"assignment_version": MAX_STEP})}
    assert highest_followed_version(records, plan) == 8
    assert highest_followed_version(records) == MAX_STEP  # with no plan to go by, every claim counts


def test_join_tokens_admit_only_the_peer_and_swarm_they_were_issued_for(tmp_path):
    coordinator, other = load_identity(tmp_path / "coordinator.key"), load_identity(tmp_path / "other.key")
    alice, bob = (peer_id_of(load_identity(tmp_path / f"{n}.key").get_public_key()) for n in ("alice", "bob"))
    token = issue_token(coordinator, SWARM, alice)
    public = coordinator.get_public_key()
    assert token_is_valid(token, public, SWARM, alice)
    assert not token_is_valid(token, public, SWARM, bob)  # another peer cannot use it
    assert not token_is_valid(token, public, "another-swarm", alice)
    assert not token_is_valid(token, other.get_public_key(), SWARM, alice)  # another coordinator did not issue it
    assert not token_is_valid("not base64 at all!", public, SWARM, alice)

    admission = Admission(swarm=SWARM, closed=True, allow=frozenset({bob}), coordinator_key=public)
    carol = "Qm" + "c" * 44
    records = {alice: make_record(alice).copy(update={"join_token": token}), bob: make_record(bob),
               carol: make_record(carol).copy(update={"join_token": token})}
    admitted, refused = admission.screen(records)
    assert set(admitted) == {alice, bob}
    assert set(refused) == {carol} and "join token is not valid" in refused[carol]
    assert Admission(swarm=SWARM).screen(records) == (records, {})  # an open swarm admits everyone


def test_an_allow_list_names_its_bad_lines_and_a_closed_swarm_needs_a_way_in(tmp_path):
    good = tmp_path / "allow.txt"
    good.write_text(f"# volunteers\n{'Qm' + 'a' * 44}  # alice\n\n")
    assert load_allow_list(good) == {"Qm" + "a" * 44}
    bad = tmp_path / "bad.txt"
    bad.write_text("Qm" + "a" * 44 + "\nnot-a-peer-id\n")
    with pytest.raises(ConfigError, match="bad.txt:2"):
        load_allow_list(bad)
    with pytest.raises(ConfigError, match="nobody can be admitted"):
        Admission(swarm=SWARM, closed=True)


@pytest.mark.swarm
def test_the_token_command_prints_a_token_that_verifies(tmp_path):
    key_path = tmp_path / "coordinator.key"
    volunteer = peer_id_of(load_identity(tmp_path / "volunteer.key").get_public_key())
    load_identity(key_path)
    done = subprocess.run([sys.executable, "-m", "hetswarm.client.cli", "token", volunteer, "--identity-path",
                           str(key_path), "--swarm", SWARM], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert token_is_valid(done.stdout.strip(), load_identity(key_path).get_public_key(), SWARM, volunteer)
    refused = subprocess.run([sys.executable, "-m", "hetswarm.client.cli", "token", "nonsense", "--identity-path",
                              str(key_path)], capture_output=True, text=True, timeout=60)
    assert refused.returncode != 0 and "not a peer id" in refused.stderr


@pytest.mark.swarm
def test_a_coordinator_round_that_fails_is_logged_and_the_next_one_goes_on(tmp_path, caplog):
    """Whatever one read brings, the coordinator's loop outlives it: here its replanner fails on the first round."""
    node, key = start_node(SWARM, tmp_path / "coordinator.key")

    class FailsOnce(Replanner):
        calls = 0

        def decide(self, records, now, **plans):
            FailsOnce.calls += 1
            if FailsOnce.calls == 1:
                raise ValueError("bandwidth_gbps has NaN or infinite entries off the diagonal")
            return super().decide(records, now, **plans)

    async def scenario() -> None:
        broadcaster = Broadcaster(node, private_key=key, coordinator_id=peer_id_of(key.get_public_key()),
                                  replanner=FailsOnce(PlannerConfig(model=get_model_config("tiny"))),
                                  config=BroadcastConfig(swarm=SWARM, interval_s=0.2))
        stop = asyncio.Event()
        task = asyncio.create_task(broadcaster.run(stop))
        await asyncio.sleep(3)
        stop.set()
        await asyncio.wait_for(task, 15)

    try:
        asyncio.run(scenario())
    finally:
        node.shutdown()
    assert FailsOnce.calls >= 3  # rounds went on after the failure
    assert any("A coordinator round failed (ValueError: bandwidth_gbps has NaN" in r.getMessage()
               for r in caplog.records)
