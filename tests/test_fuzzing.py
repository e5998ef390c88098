"""The record validators, the frame decoder, the vote reader and the judge of shown failure votes answer random and
mutated input with a verdict, never a crash (tests/helpers/fuzzing.py); bounded here, longer in benchmarks/fuzz.py."""
from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hetswarm.protocol.identity import load_identity, peer_id_of
from tests.helpers.fuzzing import (
    check_evidence,
    check_frame,
    check_record,
    check_votes,
    evidence_inputs,
    frame_inputs,
    record_inputs,
    valid_evidence,
    valid_frame,
    valid_votes,
    vote_inputs,
)

EXAMPLES = 1000
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@pytest.fixture(scope="module")
def identity(tmp_path_factory):
    key = load_identity(tmp_path_factory.mktemp("fuzz") / "fuzz.key")
    return key, peer_id_of(key.get_public_key())


def _verdicts(inputs: st.SearchStrategy, check: Callable[[object], bool]) -> list[bool]:
    """`check`'s verdict on each of EXAMPLES inputs drawn from `inputs` (an exception fails the test)."""
    verdicts = []

    @FUZZ
    @given(inputs)
    def run(value):
        verdicts.append(check(value))

    run()
    assert len(verdicts) == EXAMPLES
    return verdicts


def test_record_validators_answer_every_input_with_a_verdict(identity):
    key, peer_id = identity
    # some were refused: the inputs reach the checks
    assert not all(_verdicts(record_inputs(peer_id), lambda value: check_record(value, key)))


def test_frame_decoder_answers_every_input_with_a_verdict():
    assert check_frame(valid_frame())  # the unmutated frame is taken: mutations start from something valid
    assert not all(_verdicts(frame_inputs(), check_frame))


def test_vote_reader_answers_every_input_with_a_verdict(identity):
    key, _ = identity
    assert check_votes(valid_votes(key))  # the unmutated message holds a genuine vote
    assert not all(_verdicts(vote_inputs(key), check_votes))


def test_the_judge_of_shown_failure_votes_answers_every_record_with_a_verdict(identity):
    key, _ = identity
    assert check_evidence(valid_evidence(key), key)  # the unmutated record leaves its own voter out
    assert not all(_verdicts(evidence_inputs(key), lambda value: check_evidence(value, key)))
