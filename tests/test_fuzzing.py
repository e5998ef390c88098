"""The record validators, the frame decoder, the vote reader, the judge of shown failure votes, the reader of part
statements and the reader of the other calls' messages answer random and mutated input with a verdict, never a crash
(tests/helpers/fuzzing.py); bounded here, longer in benchmarks/fuzz.py."""
from __future__ import annotations

import pytest
from hivemind.utils.crypto import RSAPrivateKey
from hypothesis import HealthCheck, given, settings

from hetswarm.client.peer.hivemind_compat import load_identity
from hetswarm.protocol.rpc_messages import RpcMessage, encode_message, read_message
from tests.helpers.fuzzing import (
    RPC_EXAMPLES,
    check_evidence,
    check_frame,
    check_statement,
    check_votes,
    targets,
    valid_evidence,
    valid_frame,
    valid_statement,
    valid_votes,
)

EXAMPLES = 1000
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@pytest.fixture(scope="module")
def key(tmp_path_factory) -> RSAPrivateKey:
    return load_identity(tmp_path_factory.mktemp("fuzz") / "fuzz.key")


def _verdicts(key: RSAPrivateKey, target: str) -> list[bool]:
    """The verdicts of fuzz target `target` (tests/helpers/fuzzing.py) on EXAMPLES inputs (an exception fails the
    test)."""
    inputs, check = targets(key)[target]
    verdicts = []

    @FUZZ
    @given(inputs)
    def run(value):
        verdicts.append(check(value))

    run()
    assert len(verdicts) == EXAMPLES
    return verdicts


def test_record_validators_answer_every_input_with_a_verdict(key):
    assert not all(_verdicts(key, "record validators"))  # some were refused: the inputs reach the checks


def test_frame_decoder_answers_every_input_with_a_verdict(key):
    assert check_frame(valid_frame())  # the unmutated frame is taken: mutations start from something valid
    assert not all(_verdicts(key, "frame decoder"))


def test_vote_reader_answers_every_input_with_a_verdict(key):
    assert check_votes(valid_votes(key))  # the unmutated message holds a genuine vote
    assert not all(_verdicts(key, "vote reader"))


def test_the_judge_of_shown_failure_votes_answers_every_record_with_a_verdict(key):
    assert check_evidence(valid_evidence(key), key)  # the unmutated record leaves its own voter out
    assert not all(_verdicts(key, "shown failure votes"))


def test_the_reader_of_part_statements_answers_every_input_with_a_verdict(key):
    assert check_statement(valid_statement(key), key)  # the unmutated statement is its sender's
    assert not all(_verdicts(key, "part statements"))


def test_the_reader_of_call_messages_answers_every_input_with_a_verdict(key):
    """Every message type of protocol/rpc_messages.py: a valid message reads back as itself; mutated ones get a
    verdict, some of them a refusal."""
    assert set(RPC_EXAMPLES) == set(RpcMessage.__subclasses__())  # a new message type is fuzzed too
    for kind, message in RPC_EXAMPLES.items():
        assert read_message(kind, encode_message(message)) == message
    assert not all(_verdicts(key, "rpc messages"))
