"""The coordinator's judgement of the failure votes members show (coordinator/failure_votes.py), on real signed
votes: a member that aborts every attempt of a step, or one attempt in three, is left out whatever cause it names,
and takes at most one honest peer with it (the one it names every time, unless that one answers no ping: then it
alone is gone); a peer two voters name is left out alone; a fault that passes within the step's attempts implicates
nobody; and a member that shows a vote its member did not sign is left out itself."""
from __future__ import annotations

import pytest
from hivemind.utils import get_dht_time
from hivemind.utils.crypto import RSAPrivateKey

from hetswarm.client.peer.hivemind_compat import load_identity
from hetswarm.coordinator.failure_votes import MIN_ABORTS, implicated, judge_aborts, named_causes
from hetswarm.coordinator.reports import REACHED_NOBODY
from hetswarm.protocol.identity import peer_id_of
from hetswarm.protocol.keys import commit_namespace, short_id
from hetswarm.protocol.limits import ABORT_WINDOW_STEPS, MAX_ABORTED_PER_RECORD, MAX_FAILURES_PER_ATTEMPT
from hetswarm.protocol.record_store import encode_record
from hetswarm.protocol.records import Assignment, Progress
from hetswarm.protocol.vote_signing import signed_vote
from hetswarm.protocol.votes import AbortedAttempt, SignedVote
from tests.helpers.tiny_training import assignment_for

SWARM = "votes"
STEP = 12


@pytest.fixture(scope="module")
def members(tmp_path_factory) -> dict[str, RSAPrivateKey]:
    """Five identities, by peer id: a 2 × 2 plan's four members and a stranger."""
    tmp = tmp_path_factory.mktemp("keys")
    keys = [load_identity(tmp / f"peer{i}.key") for i in range(5)]
    return {peer_id_of(key.get_public_key()): key for key in keys}


@pytest.fixture(scope="module")
def plan(members) -> Assignment:
    ids = list(members)[:4]
    return assignment_for([ids[:2], ids[2:]], coordinator_id=list(members)[4])


def _failure(members: dict[str, RSAPrivateKey], plan: Assignment, voter: str, attempt: int, cause: str | None = None,
             *, version: int | None = None, step: int = STEP) -> SignedVote:
    return signed_vote(members[voter], namespace=commit_namespace(SWARM, version or plan.version), step=step,
                       attempt=attempt, ok=False, cause=cause)


def _shown(plan: Assignment, reporter: str, attempts: list[list[SignedVote]], *, steps: list[int] | None = None
           ) -> dict[str, Progress]:
    """`reporter`'s Progress record at STEP showing one failure-vote list per aborted attempt: attempts 0, 1, ... of
    STEP, or attempt 0 of each of `steps`."""
    keys = [(step, 0) for step in steps] if steps else [(STEP, index) for index in range(len(attempts))]
    aborted = [AbortedAttempt(step=step, attempt=attempt, failures=votes)
               for (step, attempt), votes in zip(keys, attempts)]
    return {reporter: Progress(peer_id=reporter, assignment_version=plan.version, step=STEP, loss=None,
                               tokens_per_s=0.0, compute_s=0.0, wait_s=0.0, health="retrying", aborted=aborted,
                               updated_at=get_dht_time())}


def test_a_member_that_aborts_every_attempt_is_left_out_whatever_cause_it_names(members, plan):
    attacker, *honest = list(plan.roles)
    for causes in ([None] * MIN_ABORTS, honest[:MIN_ABORTS], [attacker] * MIN_ABORTS):  # nobody, a new one, itself
        votes = [[_failure(members, plan, attacker, attempt, cause)] for attempt, cause in enumerate(causes)]
        assert judge_aborts(plan, SWARM, _shown(plan, honest[0], votes)) == {
            attacker: f"its failure votes aborted {MIN_ABORTS} attempts of step {STEP}"}, causes


def test_a_member_that_aborts_one_attempt_in_three_is_left_out_and_old_aborts_are_forgotten(members, plan):
    attacker, *honest = list(plan.roles)
    steps = [STEP - 2, STEP - 1, STEP]  # it lets every step commit at its second attempt
    votes = [_failure(members, plan, attacker, 0, honest[0], step=step) for step in steps]
    shown = _shown(plan, honest[1], [[vote] for vote in votes], steps=steps)
    span = f"steps {steps[0]}-{steps[-1]}"
    assert judge_aborts(plan, SWARM, shown) == {  # and the peer it names every time goes with it
        attacker: f"its failure votes aborted 3 attempts of {span}",
        honest[0]: f"named by {short_id(attacker)} as the cause of aborted attempts of {span}"}
    later = {peer: record.copy(update={"step": STEP + ABORT_WINDOW_STEPS - 1}) for peer, record in shown.items()}
    assert judge_aborts(plan, SWARM, later) == {}  # the first of them is older than the window: two are left


def test_the_peer_it_names_every_time_goes_with_it_unless_it_is_gone_and_a_peer_two_voters_name_goes_alone(
        members, plan):
    attacker, victim, *others = list(plan.roles)
    blamed = [[_failure(members, plan, attacker, attempt, victim)] for attempt in range(MIN_ABORTS)]
    assert set(judge_aborts(plan, SWARM, _shown(plan, others[0], blamed))) == {attacker, victim}
    # the same peer named by two voters (say, a reducer whose averages both its partners refuse): it alone
    corroborated = [[_failure(members, plan, voter, attempt, attacker) for voter in others]
                    for attempt in range(MIN_ABORTS)]
    found = judge_aborts(plan, SWARM, _shown(plan, victim, corroborated))
    assert list(found) == [attacker] and found[attacker].startswith("named by"), found
    # a peer one voter names that answers no ping of the coordinator is gone: its accuser is right
    assert judge_aborts(plan, SWARM, _shown(plan, others[0], blamed), gone={victim}) == {victim: REACHED_NOBODY}
    assert named_causes(plan, _shown(plan, others[0], blamed)) == {victim}


def test_a_fault_that_passes_within_the_step_implicates_nobody(members, plan):
    a, b, c, _ = list(plan.roles)
    transient = [[_failure(members, plan, a, 0, b)], [_failure(members, plan, c, 1)], [_failure(members, plan, a, 2)]]
    assert implicated(transient[0], plan.roles.keys()) == {a, b}
    assert judge_aborts(plan, SWARM, _shown(plan, b, transient)) == {}
    too_few = [[_failure(members, plan, a, attempt)] for attempt in range(MIN_ABORTS - 1)]
    assert judge_aborts(plan, SWARM, _shown(plan, b, too_few)) == {}


def test_a_member_that_shows_forged_or_foreign_votes_is_left_out_itself(members, plan):
    honest, liar, *_ = list(plan.roles)
    stranger = list(members)[4]
    forged = _failure(members, plan, liar, 0, None).copy(update={"peer": honest})  # the liar's signature
    old_plan = _failure(members, plan, honest, 1, version=plan.version - 1 or 99)
    outsider = _failure(members, plan, stranger, 2)
    for shown in (forged, old_plan, outsider):
        votes = [[shown]] + [[_failure(members, plan, honest, attempt)] for attempt in (1, 2)]
        assert list(judge_aborts(plan, SWARM, _shown(plan, liar, votes))) == [liar], shown
    # and a stranger's record, or one of another plan version, is not read at all
    votes = [[_failure(members, plan, honest, attempt)] for attempt in range(MIN_ABORTS)]
    assert judge_aborts(plan, SWARM, _shown(plan, stranger, votes)) == {}
    stale = {peer: record.copy(update={"assignment_version": plan.version + 1})
             for peer, record in _shown(plan, liar, votes).items()}
    assert judge_aborts(plan, SWARM, stale) == {}


def test_a_record_with_the_most_evidence_fits_the_dht(members, plan):
    voters = list(plan.roles)
    full = [[_failure(members, plan, voter, attempt, voters[0]) for voter in voters[:MAX_FAILURES_PER_ATTEMPT]]
            for attempt in range(MAX_ABORTED_PER_RECORD)]
    [record] = _shown(plan, voters[0], full).values()
    encode_record(record)  # raises RecordTooLarge past the limit
