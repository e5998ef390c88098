"""The signed failure votes members show the coordinator, judged: who keeps the plan from committing.

One member that votes failure on every attempt freezes the whole plan: no step commits, and restarting the same
plan changes nothing. Its votes are signed (protocol/votes.py), so the failure votes of a step's aborted attempts are
evidence no member can make up; a member shows those of the last aborted attempts in its Progress records
(client/training/progress_report.py), and the coordinator checks every signature itself.

A failure vote names its cause (the member whose frame, part or average failed it) or nobody (its own failure).
In one aborted attempt the votes implicate:
 * the voter of a failure that names no cause;
 * a peer that two voters name: one hostile member cannot cast two members' votes, so an honest one saw it fail;
 * a peer that answers no ping of the coordinator, when a voter names it: it is gone, and its accuser is right;
 * both a voter and the peer it names when no other voter names that peer: one of the two lies or the link between
   them fails, and the votes cannot say which, so no plan keeps either.
A peer implicated in MIN_ABORTS of the aborted attempts one member shows (of the last ABORT_WINDOW_STEPS steps) is
planned out. A hostile member must cast a failure vote to abort an attempt, so it is implicated in each it aborts,
whether it aborts every attempt (a frozen run) or one in three (a run three times slower); an honest peer only
through a fault that recurs (its own or its link's) or when the hostile member names it every time: one hostile voter
can take at most one honest peer out with it. Honest peers abstain rather than vote once they know of a failure
elsewhere (client/training/step_commit.py, vote_for), so an abort caused by one member does not implicate the others.

A member that shows a vote its member did not sign is hostile itself, and is planned out for it.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable, Mapping

from hetswarm.coordinator.reports import REACHED_NOBODY
from hetswarm.protocol.keys import commit_namespace, short_id
from hetswarm.protocol.limits import ABORT_WINDOW_STEPS
from hetswarm.protocol.records import Assignment, Progress
from hetswarm.protocol.vote_signing import forgery
from hetswarm.protocol.votes import AbortedAttempt, SignedVote

__all__ = ["MIN_ABORTS", "implicated", "judge_aborts", "named_causes"]

MIN_ABORTS = 3
"""Aborted attempts that must implicate a peer (a stage worker's default `max_attempts`): a fault that passes within
a retry or two implicates nobody."""


def implicated(failures: Iterable[SignedVote], members: Collection[str], gone: Collection[str] = ()) -> set[str]:
    """The peers one aborted attempt's failure votes implicate (module docstring); `gone`: members that answer no
    ping of the coordinator. A cause that is not a member, or is the voter itself, counts as naming nobody."""
    found: set[str] = set()
    named_by: dict[str, set[str]] = {}
    for vote in failures:
        if vote.cause is None or vote.cause == vote.peer or vote.cause not in members:
            found.add(vote.peer)
        else:
            named_by.setdefault(vote.cause, set()).add(vote.peer)
    for cause, voters in named_by.items():
        found.add(cause)
        if len(voters) == 1 and cause not in gone:
            found |= voters
    return found


def named_causes(plan: Assignment, progress: Mapping[str, Progress]) -> set[str]:
    """The members that failure votes shown under `plan` name as their cause: those to ping before judging."""
    return {vote.cause for _, record in _showing(plan, progress) for aborted in record.aborted
            for vote in aborted.failures if vote.cause in plan.roles}


def _showing(plan: Assignment, progress: Mapping[str, Progress]) -> list[tuple[str, Progress]]:
    """The records of `plan`'s members, made under it, that show aborted attempts, by member."""
    return [(peer, record) for peer, record in sorted(progress.items())
            if peer in plan.roles and record.assignment_version == plan.version and record.aborted]


def judge_aborts(plan: Assignment, swarm: str, progress: Mapping[str, Progress], *, gone: Collection[str] = ()
                 ) -> dict[str, str]:
    """The peers to leave out of the next plan, with why: those implicated in MIN_ABORTS of the recent aborted
    attempts a member of the plan shows, and members that showed forged votes; `gone`: members that answer no ping
    of the coordinator. (The planner logs them once, as it leaves them out.)"""
    namespace, members = commit_namespace(swarm, plan.version), plan.roles.keys()
    found: dict[str, str] = {}
    for reporter, record in _showing(plan, progress):
        if (forged := _forged(record.aborted, namespace, members)) is not None:
            found[reporter] = f"showed {forged}"
            continue
        attempts = {(aborted.step, aborted.attempt): aborted.failures for aborted in record.aborted
                    if record.step - ABORT_WINDOW_STEPS <= aborted.step <= record.step}
        counts = Counter(peer for votes in attempts.values() for peer in implicated(votes, members, gone))
        for peer, count in sorted(counts.items()):
            if count >= MIN_ABORTS:
                found.setdefault(peer, REACHED_NOBODY if peer in gone else _why(peer, attempts))
    return found


def _forged(aborted: Iterable[AbortedAttempt], namespace: str, members: Collection[str]) -> str | None:
    """What is wrong with the first vote in `aborted` that is not a member's failure vote for its attempt."""
    for attempt in aborted:
        for vote in attempt.failures:
            if vote.ok or vote.peer not in members:
                return f"a vote of {short_id(vote.peer)} that is no failure of a member, as evidence of an abort"
            if (why := forgery(vote, namespace=namespace, step=attempt.step, attempt=attempt.attempt)) is not None:
                return why.replace(vote.peer, short_id(vote.peer))
    return None


def _why(peer: str, attempts: Mapping[tuple[int, int], list[SignedVote]]) -> str:
    voted = [key for key, votes in attempts.items() if any(vote.peer == peer for vote in votes)]
    steps = sorted({step for step, _ in attempts})
    span = f"step {steps[0]}" if len(steps) == 1 else f"steps {steps[0]}-{steps[-1]}"
    if len(voted) >= MIN_ABORTS:
        return f"its failure votes aborted {len(voted)} attempts of {span}"
    accusers = sorted({short_id(vote.peer) for votes in attempts.values() for vote in votes if vote.cause == peer})
    return f"named by {', '.join(accusers)} as the cause of aborted attempts of {span}"
