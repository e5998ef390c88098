"""A volunteer's side of the plan: follow only the pinned coordinator's assignments, and only newer ones.

Anyone can publish a signed assignment under the swarm's key (docs/hivemind.md, signed assignments), so the
follower reads every entry and takes the one signed by the coordinator it was started with (`--coordinator
PEER_ID`). The DHT's validators already refuse forged signatures, malformed and oversized values; the follower
also refuses an assignment whose contents do not make a plan (an unknown model config, layer ranges that do not
cover the model, roles beyond the grid), logs why, and stays on its previous plan. An older version from the pinned
coordinator (one restarted without its state) is ignored too, and said once per version in the log.
"""
from __future__ import annotations

import logging

from hivemind.p2p import PeerID

from hetswarm.protocol.errors import HetswarmError
from hetswarm.protocol.records import Assignment, PeerRole

__all__ = ["AssignmentFollower", "check_coordinator_id", "reason_to_refuse"]

logger = logging.getLogger(__name__)


def check_coordinator_id(peer_id: str) -> str:
    """The pinned coordinator's peer id, after checking it parses as one (base58 multihash, `Qm...`)."""
    try:
        PeerID.from_base58(peer_id)
    except Exception:
        raise HetswarmError(f"--coordinator {peer_id!r} is not a peer id; copy the `Coordinator peer id: Qm...` "
                            "line the coordinator printed") from None
    return peer_id


def reason_to_refuse(assignment: Assignment) -> str | None:
    """Why an assignment that passed the schema still cannot be followed, or None if it can."""
    try:
        model = assignment.model_config()
    except (TypeError, ValueError) as e:
        return f"its model config is invalid ({e})"
    if not _cuts(assignment.stage_layers, model.n_layers):
        return f"its layer ranges {assignment.stage_layers} do not cut {model.n_layers} layers into {assignment.d_pp}"
    if len(assignment.roles) != assignment.d_pp * assignment.d_dp:
        return f"it gives {len(assignment.roles)} roles for a {assignment.d_pp} × {assignment.d_dp} grid"
    return None


def _cuts(stage_layers: list[list[int]], n_layers: int) -> bool:
    """Whether the ranges [a, b) are non-empty and cover 0..n_layers in order; stages may hold different counts."""
    ends = [0] + [b for _, b in stage_layers]
    return ends[-1] == n_layers and all(a == end and b > a for (a, b), end in zip(stage_layers, ends))


class AssignmentFollower:
    """The pinned coordinator's latest valid assignment, and this peer's role in it (None: standby)."""

    def __init__(self, coordinator_id: str, my_peer_id: str):
        self.coordinator_id, self.my_peer_id = check_coordinator_id(coordinator_id), my_peer_id
        self.current: Assignment | None = None
        self._refused: set[tuple[str, int]] = set()

    @property
    def role(self) -> PeerRole | None:
        return None if self.current is None else self.current.roles.get(self.my_peer_id)

    def consider(self, assignments: dict[str, Assignment]) -> Assignment | None:
        """Takes the pinned coordinator's entry if it is newer and valid; returns it when newly accepted.

        Args:
            assignments: valid-by-schema assignments by signer peer id (record_store.read_records).
        """
        for signer, other in assignments.items():
            if signer != self.coordinator_id and (signer, other.version) not in self._refused:
                self._refused.add((signer, other.version))
                logger.info(f"Ignored assignment v{other.version} signed by {signer}: not the pinned coordinator")
        candidate = assignments.get(self.coordinator_id)
        if candidate is None or (self.current is not None and candidate.version <= self.current.version):
            if candidate is not None and candidate.version < self.current.version:
                self._say_older(candidate)
            return None
        if (reason := reason_to_refuse(candidate)) is not None:
            if (self.coordinator_id, candidate.version) not in self._refused:
                self._refused.add((self.coordinator_id, candidate.version))
                logger.warning(f"Refused assignment v{candidate.version} from the coordinator: {reason}; "
                               f"keeping {self._describe()}")
            return None
        self.current = candidate
        logger.info(f"Following assignment v{candidate.version}: {self._describe_role()}")
        return candidate

    def _say_older(self, candidate: Assignment) -> None:
        """Once per version: the pinned coordinator went back (a restart that lost its versions), and until it
        publishes above ours this peer stays on its plan; the operator needs to see that."""
        if (self.coordinator_id, candidate.version) not in self._refused:
            self._refused.add((self.coordinator_id, candidate.version))
            logger.warning(f"Ignored assignment v{candidate.version} from the pinned coordinator: older than v"
                           f"{self.current.version}, which this peer follows")

    def _describe(self) -> str:
        return "no plan yet" if self.current is None else f"v{self.current.version}"

    def _describe_role(self) -> str:
        role = self.role
        return "standby" if role is None else f"stage {role.stage}, replica {role.replica}"
