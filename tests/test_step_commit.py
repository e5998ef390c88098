"""The commit vote (client/training/step_commit.py) over real p2p daemons: every member decides the same, a failure
vote aborts everyone, a silent member leaves the outcome unknown, and a member decides once the votes it holds
decide, without waiting for the answers to its own pushes (a round trip to the farthest member, on every step) — yet
a member that decides last and leaves at once still leaves its vote with the others."""
import asyncio
import time

import pytest

from hetswarm.client.training.errors import CommitUnknown
from hetswarm.client.training.step_commit import CommitBoard
from tests.helpers.p2p_nodes import connected_p2ps

pytestmark = pytest.mark.swarm

NAMESPACE = "commit-test_commit_v1"
SLOW_ANSWER_S = 3.0


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
    async with connected_p2ps(len(votes)) as p2ps:
        members = [p2p.peer_id for p2p in p2ps]
        boards = [CommitBoard(p2p, members, namespace=NAMESPACE) for p2p in p2ps]
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
    async with connected_p2ps(3) as p2ps:
        members = [p2p.peer_id for p2p in p2ps]
        boards = [CommitBoard(p2p, members, namespace=NAMESPACE) for p2p in p2ps]
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
