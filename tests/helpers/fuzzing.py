"""Fuzz targets of the parsers that take bytes from strangers: the record validators every DHT node runs
(protocol/signing.py, with the schemas of protocol/records.py), the frame decoder (protocol/framing.py), the
commit votes' reader and signature check (protocol/votes.py, protocol/vote_signing.py), the coordinator's
judgement of the failure votes a Progress record shows (coordinator/failure_votes.py), the reader of the signed
statements of all-reduce parts (protocol/part_statements.py), and the reader of every other call's message
(protocol/rpc_messages.py).

A target passes when the parser answers every input with a verdict (a bool, a ValidationError, a FrameError)
and never with another exception. tests/test_fuzzing.py runs them for a bounded number of inputs;
benchmarks/fuzz.py runs them for longer and counts.
"""
from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable

import pydantic.v1 as pydantic
import torch
from hivemind.dht.routing import DHTID
from hivemind.dht.validation import CompositeValidator, DHTRecord
from hivemind.proto import runtime_pb2
from hivemind.utils import MSGPackSerializer, get_dht_time
from hivemind.utils.crypto import RSAPrivateKey
from hypothesis import strategies as st

from hetswarm.coordinator.failure_votes import MIN_ABORTS, judge_aborts
from hetswarm.protocol.errors import RejectedInput
from hetswarm.protocol.framing import Expectation, FrameError, FrameHeader, decode_frame, encode_frame
from hetswarm.protocol.identity import peer_id_of
from hetswarm.protocol.keys import commit_namespace, dht_key
from hetswarm.protocol.part_statements import part_digest, read_statement, signed_statement
from hetswarm.protocol.record_store import SCHEMAS, owner_subkey
from hetswarm.protocol.records import Assignment, Hardware, LinkMeasurement, PeerRecord, Progress
from hetswarm.protocol.rpc_messages import (
    DialBackAnswer,
    DialBackRequest,
    HeldUnit,
    NewestState,
    RevealRequest,
    RpcMessage,
    StateInfo,
    StateInfoRequest,
    StepQuery,
    UnitRequest,
    encode_message,
    read_message,
)
from hetswarm.protocol.signing import make_validators
from hetswarm.protocol.vote_signing import forgery, signed_vote
from hetswarm.protocol.votes import AbortedAttempt, VoteMessage, read_votes
from hetswarm.protocol.wire_format import CODECS, DELTA_CODECS, Codec
from tests.helpers.tiny_training import assignment_for

SWARM = "fuzz"
SHAPE = (2, 4, 8)

# ---- records ------------------------------------------------------------------------------------------------

scalars = st.one_of(st.none(), st.booleans(), st.integers(min_value=-2**63, max_value=2**64 - 1),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=80), st.binary(max_size=80))
values = st.recursive(scalars, lambda children: st.one_of(
    st.lists(children, max_size=6), st.dictionaries(st.text(max_size=20), children, max_size=6)), max_leaves=30)


def valid_record_dict(peer_id: str) -> dict:
    hardware = Hardware(device="cpu", device_name="fuzz", tflops=1.0, dtype="float32", memory_gib=1.0)
    link = LinkMeasurement(latency_ms=10.0, bandwidth_mbps=100.0, measured_at=get_dht_time(), samples=3)
    return PeerRecord(peer_id=peer_id, maddrs=["/ip4/127.0.0.1/tcp/1"], version="fuzz", hardware=hardware,
                      links={"Qm" + "a" * 44: link}, state="ready", updated_at=get_dht_time()).dict()


def _paths(value, prefix=()):
    """Every path into a nested dict/list, so a mutation can reach any field of a valid record."""
    yield prefix
    if isinstance(value, dict):
        for key, child in value.items():
            yield from _paths(child, prefix + (key,))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            yield from _paths(child, prefix + (index,))


def mutated(record: dict, path: tuple, replacement) -> dict:
    """`record` with the value at `path` replaced (a deep copy)."""
    copy = json.loads(json.dumps(record, allow_nan=True))
    if not path:
        return replacement
    target = copy
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = replacement
    return copy


def record_inputs(peer_id: str) -> st.SearchStrategy:
    """Whole random values, and valid records with one field replaced by a random value."""
    base = valid_record_dict(peer_id)
    paths = list(_paths(base))
    return st.one_of(values, st.builds(mutated, st.just(base), st.sampled_from(paths), values))


def check_record(value, private_key: RSAPrivateKey, *, raw_value: bytes | None = None,
                 expiration_s: float = 30.0, field: str = "peers") -> bool:
    """Parses `value` with every schema and runs the validator stack on it; returns the stack's verdict.
    Raises AssertionError if anything answers with an exception other than a verdict."""
    for schema in SCHEMAS.values():
        try:
            schema.parse_obj(value)  # as SwarmRecords.read does, with the exceptions it catches
        except (pydantic.ValidationError, TypeError):
            pass
    try:
        payload = raw_value if raw_value is not None else MSGPackSerializer.dumps(value)
    except (TypeError, ValueError, OverflowError):
        return False  # not even msgpack: no peer could send it
    record = DHTRecord(DHTID.generate(source=dht_key(SWARM, field)).to_bytes(),
                       MSGPackSerializer.dumps(owner_subkey(private_key)), payload, get_dht_time() + expiration_s)
    validator = CompositeValidator(make_validators(SWARM, private_key))
    signed = validator.sign_value(record)  # as the publisher's node would, so the signature check passes
    verdict = validator.validate(DHTRecord(record.key, record.subkey, signed, record.expiration_time))
    assert isinstance(verdict, bool)
    return verdict


# ---- frames -------------------------------------------------------------------------------------------------

def valid_frame(codec: Codec = "fp32") -> list[runtime_pb2.ExpertRequest]:
    """A frame in `codec`: an activation delta when it is a delta codec."""
    tensor = torch.randn(SHAPE, generator=torch.Generator().manual_seed(0))
    header = FrameHeader.for_tensor(tensor, kind="activations", codec=codec, assignment_version=3, step=1,
                                    micro_batch=0, pipeline=0, base_crc=7 if codec in DELTA_CODECS else None)
    return encode_frame(header, tensor, part_size_bytes=64)


def _flip(data: bytes, index: int, byte: int) -> bytes:
    if not data:
        return bytes([byte])
    index %= len(data)
    return data[:index] + bytes([byte]) + data[index + 1:]


@st.composite
def frame_inputs(draw) -> list[runtime_pb2.ExpertRequest]:
    """Valid frames in any codec with bytes flipped, parts dropped or duplicated, and headers or tensor fields
    replaced."""
    codec = draw(st.sampled_from(CODECS + DELTA_CODECS))
    messages = [runtime_pb2.ExpertRequest.FromString(m.SerializeToString()) for m in valid_frame(codec)]
    for _ in range(draw(st.integers(1, 4))):
        index = draw(st.integers(0, len(messages) - 1))
        message = messages[index]
        match draw(st.sampled_from(["metadata", "header", "buffer", "size", "dtype", "compression", "chunks", "drop",
                                    "repeat"])):
            case "metadata":
                message.metadata = draw(st.binary(max_size=300))
            case "header":
                header = json.loads(valid_frame(codec)[0].metadata)
                field = draw(st.sampled_from(["step", "shape", "codec", "kind", "micro_batch", "delta", "base_crc", "x"]))
                header[field] = draw(values)
                messages[0].metadata = json.dumps(header, allow_nan=True, default=str).encode()
            case "buffer" if message.tensors:
                tensor = message.tensors[0]
                tensor.buffer = _flip(tensor.buffer, draw(st.integers(0, 10**6)), draw(st.integers(0, 255)))
            case "size" if message.tensors:
                del message.tensors[0].size[:]
                message.tensors[0].size.extend(draw(st.lists(st.integers(0, 10**6), max_size=4)))
            case "dtype" if message.tensors:
                message.tensors[0].dtype = draw(st.sampled_from(["float32", "bfloat16", "int64", "bool", "", "nope"]))
            case "compression" if message.tensors:
                message.tensors[0].compression = draw(st.sampled_from(runtime_pb2.CompressionType.values()))
            case "chunks" if message.tensors:
                message.tensors[0].chunks = draw(st.integers(0, 2**31 - 1))
            case "drop" if len(messages) > 1:
                messages.pop(index)
            case "repeat":
                messages.insert(index, message)
    return messages


def check_frame(messages: list[runtime_pb2.ExpertRequest]) -> bool:
    """True if a receiver expecting some codec took the frame, False if all refused it; any other exception
    propagates."""
    taken = False
    for codec, delta_codec in itertools.product(CODECS, (None, *DELTA_CODECS)):
        expected = Expectation(kind="activations", assignment_version=3, shape=SHAPE, codec=codec,
                               delta_codec=delta_codec, micro_batches=4)
        try:
            header, tensor = decode_frame(messages, expected=expected)
        except FrameError:
            continue
        assert header.codec == (delta_codec if header.delta else codec) and (header.base_crc is None) != header.delta
        assert tuple(tensor.shape) == SHAPE and bool(torch.isfinite(tensor).all())
        assert not math.isnan(tensor.sum())
        taken = True
    return taken



# ---- commit votes --------------------------------------------------------------------------------------------

VOTE_NAMESPACE = "fuzz_commit_v1"


def valid_votes(key: RSAPrivateKey) -> bytes:
    """A vote message with one genuine vote of `key`'s peer for step 5, attempt 1."""
    vote = signed_vote(key, namespace=VOTE_NAMESPACE, step=5, attempt=1, ok=True)
    return VoteMessage(step=5, attempt=1, votes=[vote]).json().encode()


@st.composite
def vote_inputs(draw, key: RSAPrivateKey) -> bytes:
    """A genuine vote message with bytes flipped, fields replaced, or votes copied, forged and multiplied."""
    message = json.loads(valid_votes(key))
    vote = message["votes"][0]
    match draw(st.sampled_from(["bytes", "field", "vote", "copies", "raw"])):
        case "bytes":
            raw = valid_votes(key)
            for _ in range(draw(st.integers(1, 8))):
                raw = _flip(raw, draw(st.integers(0, 10**6)), draw(st.integers(0, 255)))
            return raw
        case "field":
            message[draw(st.sampled_from(["step", "attempt", "votes", "x"]))] = draw(values)
        case "vote":
            vote[draw(st.sampled_from(["peer", "ok", "cause", "public_key", "signature", "x"]))] = draw(values)
        case "copies":
            message["votes"] = [vote] * draw(st.integers(0, 600))
        case "raw":
            return draw(st.binary(max_size=2000))
    return json.dumps(message, allow_nan=True, default=str).encode()


def check_votes(message: bytes) -> bool:
    """True if the message parses and holds a genuine vote, False if refused or only forged; any other exception
    propagates."""
    try:
        parsed = read_votes(message)
    except ValueError:
        return False
    return any(forgery(vote, namespace=VOTE_NAMESPACE, step=parsed.step, attempt=parsed.attempt) is None
               for vote in parsed.votes)


# ---- failure votes shown as evidence --------------------------------------------------------------------------

EVIDENCE_SWARM = "fuzz"


def evidence_plan(key: RSAPrivateKey) -> Assignment:
    """A 1 × 2 plan of `key`'s peer and another."""
    return assignment_for([[peer_id_of(key.get_public_key()), "Qm" + "b" * 44]], coordinator_id="Qm" + "c" * 44)


def valid_evidence(key: RSAPrivateKey) -> dict:
    """The Progress record of `key`'s peer showing its own failure votes at MIN_ABORTS attempts of step 5."""
    plan, peer = evidence_plan(key), peer_id_of(key.get_public_key())
    namespace = commit_namespace(EVIDENCE_SWARM, plan.version)
    aborted = [AbortedAttempt(step=5, attempt=attempt, failures=[signed_vote(
        key, namespace=namespace, step=5, attempt=attempt, ok=False, cause=None)]) for attempt in range(MIN_ABORTS)]
    return Progress(peer_id=peer, assignment_version=plan.version, step=5, loss=None, tokens_per_s=0.0,
                    compute_s=0.0, wait_s=0.0, health="retrying", aborted=aborted, updated_at=get_dht_time()).dict()


def evidence_inputs(key: RSAPrivateKey) -> st.SearchStrategy:
    """Whole random values, and the valid record with one field of it (a vote's included) replaced."""
    base = valid_evidence(key)
    return st.one_of(values, st.builds(mutated, st.just(base), st.sampled_from(list(_paths(base))), values))


def check_evidence(value, key: RSAPrivateKey) -> bool:
    """True if the record parses and its evidence leaves some peer out, False otherwise; any other exception
    propagates."""
    try:
        record = Progress.parse_obj(value)
    except (pydantic.ValidationError, TypeError):
        return False
    return bool(judge_aborts(evidence_plan(key), EVIDENCE_SWARM, {record.peer_id: record}))


# ---- statements of all-reduce parts -------------------------------------------------------------------------

STATEMENT_GROUP, STATEMENT_PARTS = b"\x07" * 32, 3
STATEMENT_REDUCER = "Qm" + "d" * 44


def valid_statement(key: RSAPrivateKey) -> bytes:
    return signed_statement(key, group_id=STATEMENT_GROUP, reducer=STATEMENT_REDUCER,
                            digests=[part_digest(bytes([i])) for i in range(STATEMENT_PARTS)])


@st.composite
def statement_inputs(draw, key: RSAPrivateKey) -> bytes:
    """A genuine statement with bytes flipped or a field replaced, or random bytes."""
    raw = valid_statement(key)
    match draw(st.sampled_from(["bytes", "field", "raw"])):
        case "bytes":
            for _ in range(draw(st.integers(1, 8))):
                raw = _flip(raw, draw(st.integers(0, 10**6)), draw(st.integers(0, 255)))
            return raw
        case "field":
            statement = json.loads(raw)
            statement[draw(st.sampled_from(["peer", "digests", "public_key", "signature", "x"]))] = draw(values)
            return json.dumps(statement, allow_nan=True, default=str).encode()
    return draw(st.binary(max_size=2000))


def check_statement(raw: bytes, key: RSAPrivateKey) -> bool:
    """True if the statement is the genuine one, False if refused; any other exception propagates."""
    try:
        read_statement(raw, group_id=STATEMENT_GROUP, sender=peer_id_of(key.get_public_key()),
                       reducer=STATEMENT_REDUCER, parts=STATEMENT_PARTS)
    except RejectedInput:
        return False
    return True


# ---- messages of the calls without tensors --------------------------------------------------------------------

RPC_EXAMPLES: dict[type[RpcMessage], RpcMessage] = {message.__class__: message for message in (
    StepQuery(step=5),
    StateInfoRequest(step=5, units=["embed", "blocks.0", "head"]),
    StateInfo(held={"blocks.0": HeldUnit(digest="ab" * 32, size=1024)}),
    NewestState(version=3, newest=None),
    UnitRequest(step=5, unit="blocks.1", digest="cd" * 32),
    RevealRequest(group="07" * 32, part=2, sender=1),
    DialBackRequest(maddrs=["/ip4/127.0.0.1/tcp/1"]),
    DialBackAnswer(reachable=None, detail="busy"),
)}
"""A valid message of every type protocol/rpc_messages.py reads."""


@st.composite
def rpc_message_inputs(draw) -> tuple[type[RpcMessage], bytes]:
    """A message type, and a valid message of it with bytes flipped or a field replaced, or random bytes."""
    kind = draw(st.sampled_from(sorted(RPC_EXAMPLES, key=lambda k: k.__name__)))
    raw = encode_message(RPC_EXAMPLES[kind])
    match draw(st.sampled_from(["bytes", "field", "raw"])):
        case "bytes":
            for _ in range(draw(st.integers(1, 8))):
                raw = _flip(raw, draw(st.integers(0, 10**6)), draw(st.integers(0, 255)))
            return kind, raw
        case "field":
            message = json.loads(raw)
            message[draw(st.sampled_from([*message, "x"]))] = draw(values)
            return kind, json.dumps(message, allow_nan=True, default=str).encode()
    return kind, draw(st.binary(max_size=2000))


def check_rpc_message(drawn: tuple[type[RpcMessage], bytes]) -> bool:
    """True if the bytes read as a message of the type, False if refused; any other exception propagates."""
    kind, raw = drawn
    try:
        read_message(kind, raw)
    except RejectedInput:
        return False
    return True


def targets(key: RSAPrivateKey) -> dict[str, tuple[st.SearchStrategy, Callable[[object], bool]]]:
    """Each fuzz target by name: the inputs it is fed and the check that gives a verdict on one (`key` is the
    identity that signs the valid records and votes the inputs start from)."""
    peer_id = peer_id_of(key.get_public_key())
    return {
        "record validators": (record_inputs(peer_id), lambda value: check_record(value, key)),
        "frame decoder": (frame_inputs(), check_frame),
        "vote reader": (vote_inputs(key), check_votes),
        "shown failure votes": (evidence_inputs(key), lambda value: check_evidence(value, key)),
        "part statements": (statement_inputs(key), lambda value: check_statement(value, key)),
        "rpc messages": (rpc_message_inputs(), check_rpc_message),
    }
