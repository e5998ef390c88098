"""Why a training step could not finish: the errors a stage worker raises to whoever drives it.

Each names the peer or the group at fault, so the driver (``hetswarm join``) can log one clear line and wait
for the coordinator's next assignment instead of stepping on a half-made gradient.
"""
import re
from collections.abc import Iterable

from hetswarm.protocol.errors import HetswarmError

__all__ = ["CommitUnknown", "FrameRefused", "NeighbourSilent", "PartialAllReduce", "StageError", "StepAborted",
           "dial_failed"]

_DIAL_FAILED = re.compile(r"connection refused|dial backoff|all dials failed", re.IGNORECASE)


def dial_failed(error: BaseException) -> bool:
    """Whether a call failed because libp2p could not connect to the peer at any of its addresses (p2pd's
    ControlFailure: refused, reset while negotiating, or backing off from redialling a peer that just failed): the
    peer is gone. A peer not yet found by routing ("no addresses") or a handler that is not there (a peer between
    plans) is not taken for gone."""
    return _DIAL_FAILED.search(str(error)) is not None


class StageError(HetswarmError):
    """A training step of this stage could not finish; the optimizer has not been stepped."""

    def __init__(self, message: str, *, peers: Iterable[object] = (), cause: object | None = None) -> None:
        super().__init__(message)
        self.peers: tuple[str, ...] = tuple(str(peer) for peer in peers)
        """The peers this failure found unreachable (a neighbour that cannot be dialled, members whose commit vote
        never came): the trainer reports them to the coordinator at once. A neighbour that only sent nothing in time
        is a cause, not unreachable (NeighbourSilent)."""
        self.cause: str | None = str(cause) if cause is not None else (self.peers[0] if self.peers else None)
        """The member whose frame, part or average failed this attempt, which this peer's failure vote names
        (client/training/step_commit.py); a peer that answers but refused or sent something bad is a cause, not
        unreachable."""


class FrameRefused(StageError):
    """A neighbour refused our activations or gradients (its reason is in the message), or could not be reached."""

    def __init__(self, message: str, *, peers: Iterable[object] = (), cause: object | None = None,
                 verdict: str | None = None) -> None:
        super().__init__(message, peers=peers, cause=cause)
        self.verdict = verdict
        """The neighbour's own answer, when it answered with a refusal."""


class NeighbourSilent(StageError):
    """A neighbour's frame for the current step did not arrive before the deadline. It names the neighbour as the
    cause and reports nobody unreachable: in a pipeline, every stage after a stuck one falls silent too, and the
    coordinator leaves out whoever reports a peer that answers its ping (coordinator/reports.py)."""


class PartialAllReduce(StageError):
    """The stage group's all-reduce lost a member: the average covers only part of the group, so it is not used."""


class StepAborted(StageError):
    """Every attempt of a step allowed by the config was aborted by the plan; no peer applied it."""


class CommitUnknown(StageError):
    """This peer could not learn whether the plan applied the step (a member's vote never reached it): it
    neither applies nor retries the step, and the plan must change."""
