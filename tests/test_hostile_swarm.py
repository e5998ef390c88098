"""A closed swarm under attack keeps training exactly as it would alone.

A coordinator (closed: join tokens) plans 2 pipelines × 2 stages of the tiny model (fp32 on the wire) over four
honest volunteers and a liar whose throughput cache claims 100× its TFLOPS, and whose Progress records report the
compute times that claim implies (tests/helpers/process_faults.py); an intruder without a token joins too.
While they train, an attacker with its own identity stores a record with an infinite link, publishes a forged
Progress at the largest step a record may carry, and floods a volunteer's probe handler: a stranger's bandwidth
probes, then one stream message that claims a gigabyte. The coordinator and every volunteer keep running; the
intruder is never planned and the liar's claim stays on probation, priced at the median claim (placed, its own
reports match its claim, but its neighbours' timings do not confirm it), both named in the coordinator's log and in
the monitor; and every loss the swarm logs equals (1e-4) that of a plain 2 × 2 run on the same data.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import math
from pathlib import Path

import pytest
import torch
from hivemind.p2p import P2P, PeerID
from hivemind.utils import get_dht_time

from hetswarm.client.local.swarm import LocalSwarm
from hetswarm.client.peer.hardware import cache_key, probe_hardware
from hetswarm.client.peer.hivemind_compat import load_identity
from hetswarm.client.peer.link_probe import SMALL_PROBE_BYTES, ProbeServicer, _stream_time
from hetswarm.protocol.identity import peer_id_of
from hetswarm.protocol.join_tokens import issue_token
from hetswarm.protocol.keys import PEERS_FIELD, PROGRESS_FIELD, dht_key, probe_namespace
from hetswarm.protocol.limits import MAX_STEP
from hetswarm.protocol.record_store import SwarmRecords, encode_record, owner_subkey
from hetswarm.protocol.records import Assignment, Progress
from tests.helpers.dht_nodes import start_node
from tests.helpers.golden_runs import losses
from tests.helpers.process_faults import compute_scale_env
from tests.helpers.swarm_logs import JOINED, logged_losses, model_file
from tests.helpers.swarm_records import make_record
from tests.helpers.tiny_training import D_DP, D_PP, SEED
from tests.helpers.waiting import wait_until

pytestmark = pytest.mark.swarm

SWARM = "hostile"
STEPS = 16
HONEST = [f"peer{i}" for i in range(4)]


def _liar_cache(folder: Path) -> dict[str, str]:
    """An XDG cache whose throughput entry for this CPU claims 100× what it measures: the liar's environment."""
    device = torch.device("cpu")
    honest = probe_hardware(device).tflops
    (folder / "hetswarm").mkdir(parents=True)
    (folder / "hetswarm" / "throughput.json").write_text(json.dumps({cache_key(device): 100 * honest}))
    return {"XDG_CACHE_HOME": str(folder)}


@pytest.fixture(scope="module")
def attacked(tmp_path_factory, golden_swarm) -> dict:
    tmp = tmp_path_factory.mktemp("hostile")
    found: dict = {}
    coordinator_key = load_identity(tmp / "coordinator.key")
    ids = {name: peer_id_of(load_identity(tmp / f"{name}.key").get_public_key())
           for name in [*HONEST, "liar", "intruder"]}
    with LocalSwarm(SWARM, workdir=tmp, preimported=True) as swarm:
        coordinator = swarm.start_coordinator(
            "coordinator", "--model", str(model_file(tmp)), "--closed", "--min-peers", "5", "--dp", str(D_DP),
            "--pp", str(D_PP), "--ttl", "20", "--debounce", "1", "--measure-wait", "20", "--time-budget", "1",
            "--reconsider", "5", "--seed", str(SEED))
        common = ("--coordinator", swarm.coordinator_id, "--ttl", "60", "--torch-threads", "1", "--seed", str(SEED),
                  "--max-steps", str(STEPS))
        clients = {name: swarm.start_client(name, *common, "--join-token",
                                            issue_token(coordinator_key, SWARM, ids[name])) for name in HONEST}
        clients["liar"] = swarm.start_client("liar", *common, "--join-token",
                                             issue_token(coordinator_key, SWARM, ids["liar"]),
                                             env=_liar_cache(tmp / "liar-cache") | compute_scale_env(0.01))
        clients["intruder"] = swarm.start_client("intruder", *common)
        via = clients["peer0"].wait_for(JOINED, 120).group(1)
        attacker, attacker_key = start_node(SWARM, tmp / "attacker.key", [via])
        try:
            records = SwarmRecords(attacker, SWARM, private_key=attacker_key)
            plan: Assignment = wait_until("the first plan", lambda: asyncio.run(records.assignments()).get(
                swarm.coordinator_id), 180)
            found["attacks"] = asyncio.run(_attack(attacker, attacker_key, records, plan, ids["peer0"]))
            found["plan"] = plan
            wait_until(f"every member past step {STEPS - 1}", lambda: _members_done(records, swarm.coordinator_id),
                       240)
            found["snapshot"] = swarm.poll(lambda s: any(s["flagged"]) and any(s["refused"]), timeout_s=60)
            found["alive"] = {name: client.process.poll() is None for name, client in clients.items()}
            found["coordinator_alive"] = coordinator.process.poll() is None
            found["coordinator_log"] = coordinator.output()
            found["losses"] = logged_losses(tmp.glob("*.log"))
            found["remembered_step"] = json.loads((tmp / "coordinator.key.state.json").read_text())["step"]
        finally:
            attacker.shutdown()
    found["ids"] = ids
    found["baseline"] = losses(golden_swarm, STEPS)
    return found


async def _attack(dht, key, records: SwarmRecords, plan: Assignment, victim: str) -> dict:
    """The attacks of the module docstring; returns what each got."""
    me = peer_id_of(key.get_public_key())
    spoiled = encode_record(make_record(me, name="attacker"))
    spoiled["links"] = {victim: {"latency_ms": 1.0, "bandwidth_mbps": math.inf, "measured_at": get_dht_time(),
                                 "samples": 1}}
    infinite_link = await dht.store(dht_key(SWARM, PEERS_FIELD), spoiled, get_dht_time() + 30,
                                    subkey=owner_subkey(key), return_future=True)
    forged = Progress(peer_id=me, assignment_version=plan.version, step=MAX_STEP, loss=0.0, tokens_per_s=1.0,
                      compute_s=0.1, wait_s=0.0, updated_at=get_dht_time())
    forged_progress = await records.publish(forged, ttl_s=60)
    p2p = await dht.replicate_p2p()
    stub = ProbeServicer.get_stub(p2p, PeerID.from_base58(victim), namespace=probe_namespace(SWARM))
    probes_refused = 0
    for _ in range(5):
        try:
            await _stream_time(stub, SMALL_PROBE_BYTES)
        except ConnectionError:
            probes_refused += 1
    handle = f"{probe_namespace(SWARM)}::ProbeServicer.rpc_absorb"
    _, reader, writer = await p2p.call_binary_stream_handler(PeerID.from_base58(victim), handle)
    async with asyncio.timeout(20):  # cut off (closed or reset), not a gigabyte later
        with contextlib.suppress(ConnectionError):
            writer.write(P2P.MESSAGE_MARKER + (2**30).to_bytes(P2P.HEADER_LEN, P2P.BYTEORDER) + bytes(65536))
            await writer.drain()
            await reader.read()
    writer.close()
    return {"infinite_link_stored": infinite_link, "forged_progress_stored": forged_progress,
            "probes_refused": probes_refused}


def _members_done(records: SwarmRecords, coordinator: str) -> bool:
    plan = asyncio.run(records.assignments()).get(coordinator)
    progress = asyncio.run(records.read(PROGRESS_FIELD))
    return plan is not None and all(
        p in progress and progress[p].assignment_version == plan.version and progress[p].step >= STEPS - 1
        for p in plan.roles)


@pytest.mark.timeout(900)
def test_the_coordinator_and_every_volunteer_keep_running_and_the_attacks_got_nowhere(attacked):
    assert attacked["coordinator_alive"] and all(attacked["alive"].values()), attacked["alive"]
    attacks = attacked["attacks"]
    assert not attacks["infinite_link_stored"]  # refused by every node's validators
    assert attacks["forged_progress_stored"]  # a valid record, but a stranger's: it must not count
    assert attacks["probes_refused"] == 5
    assert attacked["remembered_step"] <= STEPS  # the step the next plan would start at ignored the forged one


@pytest.mark.timeout(900)
def test_the_intruder_is_refused_and_the_liar_flagged_by_name(attacked):
    ids, snapshot, log = attacked["ids"], attacked["snapshot"], attacked["coordinator_log"]
    refused = {r["peer_id"]: r["reason"] for r in snapshot["refused"]}
    flagged = {r["peer_id"]: r["reason"] for r in snapshot["flagged"]}
    assert "not admitted" in refused.get(ids["intruder"], ""), refused
    assert ids["intruder"] not in snapshot["assignment"]["grid"].__repr__()
    # placed or standing by: its reports match its claim, and nothing else confirms it
    assert "on probation" in flagged.get(ids["liar"], ""), flagged
    assert ids["intruder"] in log and ids["liar"] in log


@pytest.mark.timeout(900)
def test_every_loss_equals_the_run_without_attackers(attacked):
    losses, baseline = attacked["losses"], attacked["baseline"]
    assert set(range(STEPS)) <= set(losses), sorted(losses)
    for step in range(STEPS):
        assert sorted(set(losses[step])) == pytest.approx(sorted(baseline[step]), rel=1e-4), step
