"""The record validators, the frame decoder, the vote reader and the judge of shown failure votes answer random and
mutated input with a verdict, never a crash (tests/helpers/fuzzing.py); bounded here, longer in benchmarks/fuzz.py."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings

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


def test_record_validators_answer_every_input_with_a_verdict(identity):
    key, peer_id = identity
    accepted = []

    @FUZZ
    @given(record_inputs(peer_id))
    def run(value):
        accepted.append(check_record(value, key))

    run()
    assert len(accepted) == EXAMPLES and not all(accepted)  # some were refused: the inputs reach the checks


def test_frame_decoder_answers_every_input_with_a_verdict():
    assert check_frame(valid_frame())  # the unmutated frame is taken: mutations start from something valid
    outcomes = []

    @FUZZ
    @given(frame_inputs())
    def run(messages):
        outcomes.append(check_frame(messages))

    run()
    assert len(outcomes) == EXAMPLES and not all(outcomes)


def test_vote_reader_answers_every_input_with_a_verdict(identity):
    key, _ = identity
    assert check_votes(valid_votes(key))  # the unmutated message holds a genuine vote
    outcomes = []

    @FUZZ
    @given(vote_inputs(key))
    def run(message):
        outcomes.append(check_votes(message))

    run()
    assert len(outcomes) == EXAMPLES and not all(outcomes)


def test_the_judge_of_shown_failure_votes_answers_every_record_with_a_verdict(identity):
    key, _ = identity
    assert check_evidence(valid_evidence(key), key)  # the unmutated record leaves its own voter out
    outcomes = []

    @FUZZ
    @given(evidence_inputs(key))
    def run(value):
        outcomes.append(check_evidence(value, key))

    run()
    assert len(outcomes) == EXAMPLES and not all(outcomes)
