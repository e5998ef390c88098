"""Names both ends must agree on: DHT keys and P2P handler namespaces of one swarm, derived from its name so that
several swarms can share one DHT; the key of one attempt of a step, which every frame, vote and all-reduce round of
it carries; and the short form of a peer id that people read."""
from __future__ import annotations

import re
from collections.abc import Iterable

from hetswarm.protocol.errors import RejectedInput

_SWARM_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
PEER_ID_PATTERN = r"^[1-9A-HJ-NP-Za-km-z]{32,64}$"
"""A base58 libp2p peer id, as records carry them (RSA identities give "Qm..." ids)."""

PEERS_FIELD = "peers"
ASSIGNMENT_FIELD = "assignment"
PROGRESS_FIELD = "progress"
REFUSED_FIELD = "refused"
MEASURE_FIELD = "measure"

AttemptKey = tuple[int, int]
"""(step, attempt): one attempt of a step. A retried step is the same step under attempt + 1 with the same data, so
nothing of an aborted attempt (a frame, a vote, an all-reduce part, a residual) is ever taken for the retry's."""

ReadyStep = int
"""A step as a position: the step a state is ready for, every step before it applied (StageState.step,
Assignment.step, a checkpoint's step, StageWorker.next_step, StageRole.first_step)."""
AppliedStep = int
"""A step as a result: the last step applied, whose state is ready for the step after it (StepReport.step, a
training peer's Progress.step: Progress.applied). Steps are counted from 0, so the first state is ready for 0."""


def check_swarm_name(swarm: str) -> str:
    if not _SWARM_NAME.match(swarm):
        raise RejectedInput(f"bad swarm name {swarm!r}: use 1-64 letters, digits, '_', '.' or '-'")
    return swarm


def is_peer_id(text: str) -> bool:
    return re.match(PEER_ID_PATTERN, text) is not None


def dht_key(swarm: str, field: str) -> str:
    """The raw DHT key of one schema field; hivemind's SchemaValidator(prefix=swarm) expects exactly this form."""
    return f"{check_swarm_name(swarm)}_{field}"


def probe_namespace(swarm: str) -> str:
    """Handlers that answer link probes (pings and bandwidth payloads)."""
    return f"{check_swarm_name(swarm)}.probe"


def reachability_namespace(swarm: str) -> str:
    """Handlers that dial a peer back on the addresses it announces, and tell it their clock."""
    return f"{check_swarm_name(swarm)}.reachability"


def stage_namespace(swarm: str) -> str:
    """Handlers that take activation and gradient frames from pipeline neighbours."""
    return f"{check_swarm_name(swarm)}_stage"


def allreduce_namespace(swarm: str, stage: int) -> str:
    """Handlers of one stage group's gradient all-reduce; each stage's group has its own."""
    return f"{check_swarm_name(swarm)}_stage{stage}_allreduce"


def commit_namespace(swarm: str, version: int) -> str:
    """Handlers of one plan's step-commit votes; a new plan version gets its own, so old votes never mix in."""
    return f"{stage_namespace(swarm)}_commit_v{version}"


def round_tag(swarm: str, version: int, stage: int) -> str:
    """Names one stage of one plan: its all-reduce rounds' group ids and the salt of its replica checks."""
    return f"{check_swarm_name(swarm)}/v{version}/stage{stage}"


def tied_namespace(swarm: str) -> str:
    """Handlers of the all-reduce that keeps the first and last stages' copies of a tied embedding matrix equal."""
    return f"{check_swarm_name(swarm)}_tied_allreduce"


def replica_namespace(swarm: str, stage: int) -> str:
    """Handlers that compare and copy one stage's replica state."""
    return f"{allreduce_namespace(swarm, stage)}_replicas"


def state_namespace(swarm: str) -> str:
    """Handlers that serve the training state a peer holds (its stages' last committed states, its checkpoints)."""
    return f"{check_swarm_name(swarm)}.state"


def short_id(peer_id: str) -> str:
    """The last six characters of a peer id, as tables and logs show it."""
    return "…" + peer_id[-6:]


def short_ids(peer_ids: Iterable[str]) -> str:
    """`[…abc123, …def456]`: peers as logs list them, sorted."""
    return "[" + ", ".join(sorted(map(short_id, peer_ids))) + "]"
