"""All-or-nothing steps: every peer of the plan applies a step, or none does.

A step is tried as attempt 0, 1, ... with the same data. Frames and all-reduce group ids carry (step, attempt),
so nothing of an aborted attempt leaks into the next. After its forward, backward and stage all-reduce, every
peer casts an immutable vote for (step, attempt): success, or failure (a refused, lost or unanswered frame, a
silent neighbour, a partial all-reduce), naming the member at fault when it knows one; a peer that stopped only
because it learnt of another's failure abstains. The decision is a pure function of the votes:

  * some vote is a failure      -> abort: gradients zeroed, no optimizer step, retry as attempt + 1;
  * every member voted success  -> commit: apply the averaged gradients, go to the next step (a single stage has
                                    applied them already, on its own success, and puts them back on an abort:
                                    client/training/stage_worker.py);
  * otherwise                   -> undecided: keep asking.

A vote never changes once cast, so two peers can never decide differently: one that commits has seen every
member's success, and a failure vote cannot exist for that attempt. Votes travel by ``rpc_exchange``: the caller
sends every vote it knows for (step, attempt) and gets back every vote the callee knows (votes of others are
relayed, so a peer can learn the vote of a member that died after voting). A peer pushes its vote to every member
at once (a failure therefore reaches the others while they still wait for frames or parts, and they abort
without waiting out their timeouts), and decides as soon as the votes it holds decide: it does not wait for the
answers to its pushes, so the last member's vote ends the step one latency after it is cast, not a round trip to
the farthest member later. Until it can decide, it pulls from the members whose votes it lacks. A
peer that cannot decide by the deadline (a member died before anyone heard its vote) raises ``CommitUnknown``:
it neither commits nor retries, and waits for a new plan.

The board keeps the votes of the last few steps, so a peer that has moved on still answers a slower one. Every vote
travels with its member's signature (protocol/votes.py), relayed or not: a vote its member did not sign is refused
and whoever relayed it is named (`forgeries`), and a member that signed two votes for one attempt is named too (its
first vote stands). A board holds votes for a bounded number of keys, near the step it is at. The failure votes of
the last aborted attempts are what a member shows the coordinator in its Progress records (`aborted`;
coordinator/failure_votes.py judges them).
"""
import asyncio
import logging
import time
from collections import deque
from collections.abc import Iterable, Sequence

from hivemind.p2p import P2P, P2PContext, PeerID, ServicerBase
from hivemind.proto import runtime_pb2
from hivemind.utils.crypto import RSAPrivateKey

from hetswarm.client.peer.served import Served
from hetswarm.client.training.errors import CommitUnknown, StageError
from hetswarm.protocol.keys import AttemptKey
from hetswarm.protocol.limits import ABORT_WINDOW_STEPS, MAX_ABORTED_PER_RECORD, MAX_FAILURES_PER_ATTEMPT
from hetswarm.protocol.vote_signing import forgery, signed_vote
from hetswarm.protocol.votes import AbortedAttempt, SignedVote, VoteMessage, read_votes

__all__ = ["CommitBoard", "vote_for"]

logger = logging.getLogger(__name__)

_KEEP_STEPS = 3
_POLL_MIN_S, _POLL_MAX_S = 0.02, 0.5
_CALL_TIMEOUT_S = 5.0
_MAX_KEYS = 4 * _KEEP_STEPS + 8
"""Keys (step, attempt) a board holds votes for: a member cannot make it keep votes for any number of them."""
_STEPS_AHEAD = 2
"""How far past the step a board is at a vote may be (a neighbour that finished first is one step ahead)."""


class CommitBoard(Served, ServicerBase):
    """This peer's view of the votes of the plan's members; namespaced per swarm and assignment."""

    def __init__(self, p2p: P2P, members: Sequence[PeerID], *, namespace: str, private_key: RSAPrivateKey) -> None:
        """
        Args:
            private_key: this peer's identity (p2p's peer id is its), which signs its votes.
        """
        if p2p.peer_id not in members:
            raise ValueError(f"{p2p.peer_id} is not among the plan's members {list(map(str, members))}")
        self.p2p, self.namespace, self.private_key = p2p, namespace, private_key
        self.members = frozenset(members)
        self._by_name = {peer.to_base58(): peer for peer in members}
        self._votes: dict[AttemptKey, dict[PeerID, SignedVote]] = {}
        self._step: int | None = None
        """The step this board is at (`prune`); None before its first."""
        self.forgeries: dict[PeerID, str] = {}
        """Peers that relayed a vote its member did not sign, or signed two votes for one attempt: the last, why."""
        self._past_aborts: deque[AbortedAttempt] = deque(maxlen=MAX_ABORTED_PER_RECORD)
        """The failure votes of aborted attempts of steps `prune` forgot: kept for `aborted`."""
        self._changed = asyncio.Event()
        self._calls: dict[tuple[AttemptKey, PeerID], asyncio.Task] = {}
        """Exchanges in flight: a push outlives the decision it served, so that its member still hears our vote
        (`detach` waits for them)."""

    async def detach(self) -> None:
        """Stops serving once the exchanges in flight are answered (or time out): a member that decided first and
        leaves at once (its last step, a new plan) must not take its vote away before the others have it."""
        if self._calls:
            await asyncio.wait(list(self._calls.values()), timeout=_CALL_TIMEOUT_S)
        for call in list(self._calls.values()):
            call.cancel()
        await super().detach()

    def record(self, key: AttemptKey, votes: Iterable[SignedVote], *, relayer: PeerID) -> None:
        """Merges the votes `relayer` brought that their members signed; a member's first vote for a key stands."""
        known = self._votes.setdefault(key, {})
        for vote in votes:
            if (peer := self._by_name.get(vote.peer)) is None:
                continue
            held = known.get(peer)
            if held is not None and held.signature == vote.signature:
                continue  # checked when it first came
            if (why := forgery(vote, namespace=self.namespace, step=key[0], attempt=key[1])) is not None:
                self._name(relayer, f"relayed {why}", key)
            elif held is None:
                known[peer] = vote
            elif (held.ok, held.cause) != (vote.ok, vote.cause):
                self._name(peer, f"signed two votes (kept its {'success' if held.ok else 'failure'})", key)
        self._changed.set()

    def _name(self, peer: PeerID, why: str, key: AttemptKey) -> None:
        self.forgeries[peer] = why
        logger.warning(f"{peer} {why} for step {key[0]}, attempt {key[1]}; refused")

    def outcome(self, key: AttemptKey) -> bool | None:
        """False once any member voted failure, True once every member voted success, else None."""
        known = self._votes.get(key, {})
        if not all(vote.ok for vote in known.values()):
            return False
        return True if len(known) == len(self.members) else None

    async def wait_failed(self, key: AttemptKey) -> None:
        """Returns once some member's failure vote for ``key`` is known here."""
        while self.outcome(key) is not False:
            self._changed.clear()
            await self._changed.wait()

    def succeeded(self, key: AttemptKey, peer: str | None) -> bool:
        """Whether `peer`'s success vote for ``key`` is known here."""
        vote = self._votes.get(key, {}).get(self._by_name[peer]) if peer in self._by_name else None
        return vote is not None and vote.ok

    async def failed_within(self, key: AttemptKey, seconds: float) -> bool:
        """Whether some member's failure vote for ``key`` is known here within `seconds`."""
        try:
            async with asyncio.timeout(seconds):
                await self.wait_failed(key)
            return True
        except TimeoutError:
            return False

    def aborted(self, step: int) -> list[AbortedAttempt]:
        """The failure votes this board holds for the last aborted attempts of the ABORT_WINDOW_STEPS steps up to
        `step`: the evidence of who aborted them (protocol/votes.py), a record's worth."""
        held = [self._failures(key) for key in sorted(self._votes)]
        recent = [aborted for aborted in [*self._past_aborts, *filter(None, held)]
                  if step - ABORT_WINDOW_STEPS <= aborted.step <= step]
        return recent[-MAX_ABORTED_PER_RECORD:]

    def _failures(self, key: AttemptKey) -> AbortedAttempt | None:
        failures = sorted((vote for vote in self._votes.get(key, {}).values() if not vote.ok), key=lambda v: v.peer)
        if not failures:
            return None
        return AbortedAttempt(step=key[0], attempt=key[1], failures=failures[:MAX_FAILURES_PER_ATTEMPT])

    def prune(self, step: int) -> None:
        """Moves the board to `step`: forgets votes of steps before ``step - _KEEP_STEPS`` (but the failure votes of
        the last aborted attempts)."""
        self._step = step
        for key in sorted(key for key in self._votes if key[0] < step - _KEEP_STEPS):
            if (aborted := self._failures(key)) is not None:
                self._past_aborts.append(aborted)
            del self._votes[key]

    async def decide(self, key: AttemptKey, vote: bool | None, *, cause: str | None = None, timeout_s: float) -> bool:
        """Casts this peer's vote (a failure naming its `cause`, the member that failed it, when known) and returns
        the plan's decision: True to commit, False to abort. ``vote=None`` abstains: a peer that stopped because it
        learnt another's failure casts no vote of its own (it would implicate nobody truly at fault:
        coordinator/failure_votes.py), and still relays the votes it holds.

        Raises:
            CommitUnknown: some member's vote could not be learnt within ``timeout_s``, and no failure is known.
        """
        others = sorted(self.members - {self.p2p.peer_id}, key=lambda peer: peer.to_bytes())
        if vote is not None:
            mine = signed_vote(self.private_key, namespace=self.namespace, step=key[0], attempt=key[1], ok=vote,
                               cause=None if vote or cause not in self._by_name else cause)
            self.record(key, [mine], relayer=self.p2p.peer_id)
            for peer in others:  # push our vote to everyone
                self._call(peer, key)
        deadline, pause = time.monotonic() + timeout_s, _POLL_MIN_S
        while (outcome := self.outcome(key)) is None:
            if time.monotonic() > deadline:
                missing = sorted(map(str, self.members - set(self._votes.get(key, {}))))
                raise CommitUnknown(f"step {key[0]}, attempt {key[1]}: no vote from {', '.join(missing)} within "
                                    f"{timeout_s} s; whether the plan applied the step is unknown", peers=missing)
            self._changed.clear()
            try:
                async with asyncio.timeout(pause):
                    await self._changed.wait()  # a vote pushed to us
                continue
            except TimeoutError:
                pass
            for peer in others:  # pull the votes we lack, from members not already being asked
                if peer not in self._votes.get(key, {}) and (key, peer) not in self._calls:
                    self._call(peer, key)
            pause = min(2 * pause, _POLL_MAX_S)
        return outcome

    def _call(self, peer: PeerID, key: AttemptKey) -> None:
        """Starts an exchange of votes with `peer` (at most one per key and peer at a time)."""
        call = self._calls[key, peer] = asyncio.create_task(self._exchange(peer, key))
        call.add_done_callback(lambda _: self._calls.pop((key, peer), None))

    async def _exchange(self, peer: PeerID, key: AttemptKey) -> None:
        stub = CommitBoard.get_stub(self.p2p, peer, namespace=self.namespace)
        try:
            response = await stub.rpc_exchange(runtime_pb2.ExpertRequest(metadata=self._encode(key)),
                                               timeout=_CALL_TIMEOUT_S)
            self._merge(response.metadata, key, sender=peer)
        except Exception as e:  # unreachable for now: the decision loop asks again
            logger.debug(f"Vote exchange with {peer} for {key} failed: {e!r}", exc_info=True)

    async def rpc_exchange(self, request: runtime_pb2.ExpertRequest, context: P2PContext
                           ) -> runtime_pb2.ExpertResponse:
        """Takes the caller's votes for one (step, attempt) and answers with ours."""
        if context.remote_id not in self.members:
            logger.warning(f"Refused votes from {context.remote_id}: not a member of this plan")
            return runtime_pb2.ExpertResponse()
        try:
            key = self._merge(request.metadata, None, sender=context.remote_id)
        except ValueError as e:
            logger.warning(f"Refused votes from {context.remote_id}: {e}")
            return runtime_pb2.ExpertResponse()
        return runtime_pb2.ExpertResponse(metadata=self._encode(key))

    def _encode(self, key: AttemptKey) -> bytes:
        votes = list(self._votes.get(key, {}).values())
        return VoteMessage(step=key[0], attempt=key[1], votes=votes).json().encode()

    def _merge(self, metadata: bytes, expected: AttemptKey | None, *, sender: PeerID) -> AttemptKey:
        """Records the votes in a peer's message; returns its key.

        Raises:
            ValueError: a malformed or oversized message, or one for a key this board does not take.
        """
        message = read_votes(metadata)
        key = (message.step, message.attempt)
        if expected is not None and key != expected:
            raise ValueError(f"answer for {key}, asked about {expected}")
        if self._step is not None and not self._step - _KEEP_STEPS <= key[0] <= self._step + _STEPS_AHEAD:
            raise ValueError(f"votes for step {key[0]}, this board is at step {self._step}")
        if key not in self._votes and len(self._votes) >= _MAX_KEYS:
            raise ValueError(f"votes for step {key[0]}, attempt {key[1]}: already {_MAX_KEYS} attempts held")
        self.record(key, message.votes, relayer=sender)
        return key


async def vote_for(board: CommitBoard, key: AttemptKey, succeeded: bool, error: StageError | None, *,
                   blame_grace_s: float) -> tuple[bool | None, str | None]:
    """This peer's vote on an attempt: success; a failure naming the member that caused it; or none at all
    (abstain) when it stopped on another member's failure, or learns of one within `blame_grace_s` of its own
    while the member it blames has not voted success (cancelled streams and broken rounds follow an abort): a
    vote would implicate peers that did nothing wrong (coordinator/failure_votes.py). A member that voted
    success and failed us anyway is named, whatever else failed: that is how two partners of a hostile reducer
    corroborate each other."""
    if succeeded:
        return True, None
    if error is None:
        return None, None
    if await board.failed_within(key, blame_grace_s) and not board.succeeded(key, error.cause):
        return None, None
    return False, error.cause
