"""The commit vote (client/training/step_commit.py) over real p2p daemons: every member decides the same, a failure
vote aborts everyone, a silent member leaves the outcome unknown, and a member decides once the votes it holds
decide, without waiting for the answers to its own pushes (a round trip to the farthest member, on every step) — yet
a member that decides last and leaves at once still leaves its vote with the others. Votes are signed: a relayed vote
its member did not sign is refused and its relayer named, votes far from the board's step are not kept, and the
failure votes of aborted attempts outlive the steps a board forgets, for as long as they are evidence."""
import asyncio
import time
from types import SimpleNamespace

import pytest
from hivemind.p2p import P2P, PeerID
from hivemind.proto import runtime_pb2
from hivemind.utils.crypto import RSAPrivateKey

from hetswarm.client.peer.hivemind_compat import load_identity
from hetswarm.client.training.errors import CommitUnknown
from hetswarm.client.training.step_commit import CommitBoard
from hetswarm.protocol.identity import peer_id_of
from hetswarm.protocol.limits import ABORT_WINDOW_STEPS
from hetswarm.protocol.vote_signing import signed_vote
from hetswarm.protocol.votes import VoteMessage
from tests.helpers.p2p_nodes import keyed_p2ps

pytestmark = pytest.mark.swarm

NAMESPACE = "commit-test_commit_v1"
SLOW_ANSWER_S = 3.0


def _boards(peers: list[tuple[P2P, RSAPrivateKey]]) -> list[CommitBoard]:
    members = [p2p.peer_id for p2p, _ in peers]
    return [CommitBoard(p2p, members, namespace=NAMESPACE, private_key=key) for p2p, key in peers]


def _answer_late(board: CommitBoard) -> None:
    """Makes `board` take votes at once but answer late, as a member behind a long link looks to whoever pushes to
    it (its handler, not its class, is replaced: handler names come from the class name)."""
    exchange = board.rpc_exchange

    async def late(request, context):
        response = await exchange(request, context)
        await asyncio.sleep(SLOW_ANSWER_S)
        return response

    board.rpc_exchange = late


async def _decide(votes: list[bool | None], *, slow: int | None = None, timeout_s: float = 10.0
                  ) -> list[tuple[bool | BaseException, float]]:
    """Each member casts its vote (None: never votes) for step 4, attempt 0; returns each voter's decision or error
    and the seconds it took."""
    async with keyed_p2ps(len(votes)) as peers:
        boards = _boards(peers)
        if slow is not None:
            _answer_late(boards[slow])
        for board in boards:
            await board.attach()

        async def timed(board: CommitBoard, vote: bool) -> tuple[bool | BaseException, float]:
            started = time.monotonic()
            try:
                outcome = await board.decide((4, 0), vote, timeout_s=timeout_s)
            except CommitUnknown as e:
                outcome = e
            return outcome, time.monotonic() - started

        try:
            return await asyncio.gather(*(timed(board, vote) for board, vote in zip(boards, votes) if vote is not None))
        finally:
            for board in boards:
                await board.detach()


@pytest.mark.timeout(60)
def test_a_member_decides_without_waiting_for_the_answers_to_its_pushes():
    decisions = asyncio.run(_decide([True, True, True], slow=2))
    assert [outcome for outcome, _ in decisions] == [True, True, True]
    for outcome, seconds in decisions[:2]:  # the slow member's own push reached them long before its answers would
        assert seconds < SLOW_ANSWER_S / 2, decisions


@pytest.mark.timeout(60)
def test_one_failure_vote_aborts_every_member():
    decisions = asyncio.run(_decide([True, False, True]))
    assert [outcome for outcome, _ in decisions] == [False, False, False]


@pytest.mark.timeout(60)
def test_a_member_that_never_votes_leaves_the_outcome_unknown_and_is_named():
    decisions = asyncio.run(_decide([True, True, None], timeout_s=2.0))
    for outcome, seconds in decisions:
        assert isinstance(outcome, CommitUnknown) and len(outcome.peers) == 1, decisions
        assert 2.0 <= seconds < 8.0


async def _last_voter_leaves_at_once() -> list[bool | BaseException]:
    async with keyed_p2ps(3) as peers:
        boards = _boards(peers)
        for board in boards:
            await board.attach()
        waiting = [asyncio.create_task(board.decide((4, 0), True, timeout_s=5.0)) for board in boards[:2]]
        while len(boards[2]._votes.get((4, 0), {})) < 2:  # the last voter holds both other votes
            await asyncio.sleep(0.01)
        assert await boards[2].decide((4, 0), True, timeout_s=5.0)  # decides without a single await on the network
        await boards[2].detach()  # and leaves at once, as after its last step
        outcomes = await asyncio.gather(*waiting, return_exceptions=True)
        for board in boards[:2]:
            await board.detach()
        return outcomes


@pytest.mark.timeout(60)
def test_a_member_that_decides_last_and_leaves_at_once_still_delivers_its_vote():
    assert asyncio.run(_last_voter_leaves_at_once()) == [True, True]


async def _forged_relays() -> tuple[list[bool], CommitBoard, str, bytes, bytes]:
    """Member 2 relays to member 1 a failure vote of member 0 (signed by itself, then under member 0's key with its
    own signature), and both votes of its own; then everyone votes success."""
    async with keyed_p2ps(3) as peers:
        boards = _boards(peers)
        for board in boards:
            await board.attach()
        (_, honest_key), (target, _), (relayer, relayer_key) = peers
        victim = peers[0][0].peer_id.to_base58()
        under_own_key = signed_vote(relayer_key, namespace=NAMESPACE, step=4, attempt=0, ok=False)
        unsigned = signed_vote(honest_key, namespace=NAMESPACE, step=4, attempt=0, ok=True).copy(
            update={"ok": False})  # its key, a signature over the other vote
        stub = CommitBoard.get_stub(relayer, target.peer_id, namespace=NAMESPACE)
        for vote in (under_own_key.copy(update={"peer": victim}), unsigned):
            message = VoteMessage(step=4, attempt=0, votes=[vote]).json().encode()
            await stub.rpc_exchange(runtime_pb2.ExpertRequest(metadata=message))
        far = VoteMessage(step=4 + 10**6, attempt=0, votes=[under_own_key]).json().encode()
        boards[1].prune(4)
        answer = await stub.rpc_exchange(runtime_pb2.ExpertRequest(metadata=far))
        outcomes = await asyncio.gather(*(board.decide((4, 0), True, timeout_s=10.0) for board in boards))
        for board in boards:
            await board.detach()
        return list(outcomes), boards[1], relayer.peer_id, answer.metadata, boards[1]._encode((4, 0))


@pytest.mark.timeout(60)
def test_a_relayed_vote_its_member_did_not_sign_is_refused_and_the_relayer_named():
    outcomes, target, relayer, far_answer, held = asyncio.run(_forged_relays())
    assert outcomes == [True, True, True]  # the forged failures aborted nothing
    assert "did not sign" in target.forgeries[relayer] or "another peer's key" in target.forgeries[relayer]
    assert far_answer == b""  # votes a million steps ahead: refused, nothing kept
    assert all(key[0] == 4 for key in target._votes) and len(VoteMessage.parse_raw(held).votes) == 3


def test_a_member_that_signs_two_votes_is_named_and_its_first_vote_stands(tmp_path):
    keys = [load_identity(tmp_path / f"peer{index}.key") for index in range(2)]
    ids = [PeerID.from_base58(peer_id_of(key.get_public_key())) for key in keys]
    board = CommitBoard(SimpleNamespace(peer_id=ids[0]), ids, namespace=NAMESPACE, private_key=keys[0])
    success, failure = (signed_vote(keys[1], namespace=NAMESPACE, step=4, attempt=0, ok=ok) for ok in (True, False))
    board.record((4, 0), [success], relayer=ids[1])
    board.record((4, 0), [failure], relayer=ids[0])
    assert "signed two votes (kept its success)" in board.forgeries[ids[1]]
    assert board.outcome((4, 0)) is None  # its success stands; this member's own vote is still to come
    # two failures that name different causes are two votes too: evidence must show the one it cast first
    first, other = (signed_vote(keys[1], namespace=NAMESPACE, step=4, attempt=1, ok=False, cause=cause)
                    for cause in (None, ids[0].to_base58()))
    board.record((4, 1), [first], relayer=ids[1])
    board.forgeries.clear()
    board.record((4, 1), [other], relayer=ids[0])
    assert "signed two votes (kept its failure)" in board.forgeries[ids[1]]
    assert [vote.cause for attempt in board.aborted(4) for vote in attempt.failures] == [None]


def test_the_failure_votes_of_aborted_attempts_outlive_the_steps_a_board_forgets(tmp_path):
    keys = [load_identity(tmp_path / f"peer{index}.key") for index in range(2)]
    ids = [PeerID.from_base58(peer_id_of(key.get_public_key())) for key in keys]
    board = CommitBoard(SimpleNamespace(peer_id=ids[0]), ids, namespace=NAMESPACE, private_key=keys[0])
    for step in range(0, 60, 10):  # one aborted attempt every ten steps, then a committed one
        board.prune(step)
        board.record((step, 0), [signed_vote(keys[1], namespace=NAMESPACE, step=step, attempt=0, ok=False)],
                     relayer=ids[1])
        board.record((step, 1), [signed_vote(key, namespace=NAMESPACE, step=step, attempt=1, ok=True) for key in keys],
                     relayer=ids[1])
    assert [(a.step, a.attempt) for a in board.aborted(50)] == [(step, 0) for step in range(0, 60, 10)]
    assert [a.step for a in board.aborted(10 + ABORT_WINDOW_STEPS)] == [10, 20, 30, 40, 50]  # older: forgotten
