"""A client follows only its pinned coordinator's newer, sound assignments; anything else is refused and logged."""
from __future__ import annotations

import logging

import base58
import pydantic.v1 as pydantic
import pytest
from hivemind.dht.routing import DHTID
from hivemind.dht.validation import CompositeValidator, DHTRecord
from hivemind.utils import MSGPackSerializer, get_dht_time

from hetswarm.client.peer.assignment_follower import AssignmentFollower, check_coordinator_id
from hetswarm.client.peer.hivemind_compat import load_identity
from hetswarm.coordinator.assignment_record import build_assignment
from hetswarm.coordinator.planner import PlannerConfig, propose
from hetswarm.coordinator.scheduling.search import SearchConfig
from hetswarm.coordinator.swarm_view import build_view
from hetswarm.protocol.errors import HetswarmError, RecordTooLarge
from hetswarm.protocol.keys import ASSIGNMENT_FIELD, dht_key
from hetswarm.protocol.limits import MAX_RECORD_BYTES
from hetswarm.protocol.model_config import get_model_config
from hetswarm.protocol.record_store import encode_record, owner_subkey
from hetswarm.protocol.records import Assignment, PeerRole
from hetswarm.protocol.signing import make_validators
from tests.helpers.swarm_records import IDS, record

COORDINATOR, FORGER = IDS[8], IDS[9]
PEERS = IDS[:4]


@pytest.fixture(scope="module")
def proposal():
    view = build_view({p: record(p) for p in PEERS})
    return propose(view, PlannerConfig(model=get_model_config("tiny"), d_dp=2, d_pp=2,
                                       search=SearchConfig(time_budget_s=1.0)))


def assignment(proposal, version: int, signer: str = COORDINATOR) -> Assignment:
    return build_assignment(proposal, coordinator_id=signer, version=version, reason="test", step=0)


def test_only_the_pinned_coordinators_newer_versions_are_followed(proposal, caplog):
    me = proposal.pipelines[1][0]
    follower = AssignmentFollower(COORDINATOR, me)
    with caplog.at_level(logging.INFO):
        assert follower.consider({FORGER: assignment(proposal, 9, FORGER)}) is None
        accepted = follower.consider({COORDINATOR: assignment(proposal, 2), FORGER: assignment(proposal, 9, FORGER)})
    assert accepted.version == 2 and follower.role == PeerRole(stage=0, replica=1)
    assert f"Ignored assignment v9 signed by {FORGER}" in caplog.text
    assert "Following assignment v2: stage 0, replica 1" in caplog.text
    assert follower.consider({COORDINATOR: assignment(proposal, 2)}) is None  # the republished same version
    assert follower.consider({COORDINATOR: assignment(proposal, 1)}) is None  # never back to an older plan
    assert follower.current.version == 2


def test_a_peer_outside_the_plan_is_a_standby():
    follower = AssignmentFollower(COORDINATOR, IDS[7])
    assert follower.role is None


@pytest.mark.parametrize("damage, reason", [
    ({"model": {"name": "tiny", "n_layers": -1}}, "model config is invalid"),
    ({"stage_layers": [[0, 1], [1, 3]]}, "layer ranges"),
])
def test_an_unsound_assignment_is_refused_with_a_warning_and_the_previous_plan_stays(proposal, caplog, damage, reason):
    follower = AssignmentFollower(COORDINATOR, PEERS[0])
    follower.consider({COORDINATOR: assignment(proposal, 1)})
    bad = assignment(proposal, 2).copy(update=damage)
    with caplog.at_level(logging.WARNING):
        assert follower.consider({COORDINATOR: bad}) is None
    assert f"Refused assignment v2 from the coordinator: its {reason}" in caplog.text
    assert "keeping v1" in caplog.text
    assert follower.current.version == 1


@pytest.mark.parametrize("theta", [float("nan"), float("inf")])
def test_a_llama_plan_carries_its_float_fields_but_never_a_non_finite_one(proposal, theta):
    data = assignment(proposal, 1).dict()
    llama = {"architecture": "llama", "n_kv_heads": 2, "d_ff": 96, "rope_theta": 5e5, "norm_eps": 1e-6}
    parsed = Assignment.parse_obj(data | {"model": data["model"] | llama}).model_config()
    assert (parsed.architecture, parsed.kv_heads, parsed.rope_theta, parsed.norm_eps) == ("llama", 2, 5e5, 1e-6)
    with pytest.raises(pydantic.ValidationError, match="model"):
        Assignment.parse_obj(data | {"model": data["model"] | llama | {"rope_theta": theta}})


def test_an_oversized_assignment_is_refused_before_sending_and_by_every_validator(tmp_path):
    peers = [base58.b58encode((2**370 + i).to_bytes(47, "big")).decode() for i in range(512)]  # 64 characters
    huge = Assignment(
        coordinator_id=COORDINATOR, version=1, model=get_model_config("tiny").to_dict(), d_pp=1, d_dp=512,
        stage_layers=[[0, 4]], roles={p: PeerRole(stage=0, replica=r) for r, p in enumerate(peers)},
        pipelines=[[p] for p in peers], predicted_step_s=1.0, breakdown={}, micro_batches=1, step=0, reason="",
        issued_at=get_dht_time(),
    )
    with pytest.raises(RecordTooLarge, match=str(MAX_RECORD_BYTES)):
        encode_record(huge)
    key = load_identity(tmp_path / "coordinator.key")
    raw = MSGPackSerializer.dumps(huge.dict())
    dht_record = DHTRecord(DHTID.generate(source=dht_key("fol", ASSIGNMENT_FIELD)).to_bytes(),
                           MSGPackSerializer.dumps(owner_subkey(key)), raw, get_dht_time() + 30)
    assert not CompositeValidator(make_validators("fol", key)).validate(dht_record)


def test_a_coordinator_id_that_is_not_a_peer_id_is_refused_at_once():
    with pytest.raises(HetswarmError, match="not a peer id"):
        check_coordinator_id("not-a-peer-id")
