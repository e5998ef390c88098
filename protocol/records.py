"""Schemas of the three records a swarm keeps in the DHT: who is there, what the plan is, how training goes.

Every node validates every record against these pydantic.v1 models with strict types (hivemind's
SchemaValidator refuses any value that pydantic would have to convert), so a float where an int belongs, an
unknown field or an out-of-range figure is refused on arrival, not discovered by the reader.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Literal

import pydantic.v1 as pydantic
from pydantic.v1 import StrictBool, StrictInt, StrictStr, confloat, conint, conlist, constr

from hetswarm.protocol.keys import PEER_ID_PATTERN, AppliedStep
from hetswarm.protocol.limits import (
    MAX_ABORTED_PER_RECORD,
    MAX_BANDWIDTH_MBPS,
    MAX_CHECKPOINTS_PER_RECORD,
    MAX_LATENCY_MS,
    MAX_LAYERS,
    MAX_LINKS_PER_RECORD,
    MAX_LOSS,
    MAX_MEMORY_GIB,
    MAX_PEERS_PER_ASSIGNMENT,
    MAX_RECENT_LOSSES,
    MAX_REFUSED_PER_RECORD,
    MAX_REQUESTED_LINKS,
    MAX_SECONDS,
    MAX_STEP,
    MAX_TFLOPS,
    MAX_TIMESTAMP,
    MAX_TOKEN_CHARS,
    MAX_UNREACHABLE_PER_RECORD,
)
from hetswarm.protocol.model_config import ModelConfig, PipelineSchedule
from hetswarm.protocol.votes import AbortedAttempt
from hetswarm.protocol.wire_format import WireFormat

PeerId = str  # base58 libp2p peer id (RSA identities give "Qm..." ids)
PeerState = Literal["joining", "ready", "training", "leaving"]
Health = Literal["training", "retrying", "stalled"]
Aggregation = Literal["mean", "centered_clip"]
"""How a stage group's reducers combine the members' gradients (client/training/robust_aggregation.py)."""
StateOrigin = Literal["seed", "kept", "handed off", "checkpoint"]
"""Where a stage's state came from when its plan started: the seed, this peer's own state, other peers' (a
hand-off), or checkpoints (a resume)."""
"""Of a training peer: committing steps; failing attempts of a step and retrying it; given up on this plan."""

_PeerIdStr = constr(strict=True, regex=PEER_ID_PATTERN)
_Name = constr(strict=True, max_length=64)
_Seconds = confloat(strict=True, ge=0.0, le=MAX_SECONDS)
_Timestamp = confloat(strict=True, ge=0.0, lt=MAX_TIMESTAMP)
"""hivemind DHT time. Every float field has bounds, so NaN and infinities are refused too (they fail any bound)."""
_Step = conint(strict=True, ge=0, le=MAX_STEP)
_Codec = constr(strict=True, max_length=8)
_WireValue = (_Codec | confloat(strict=True, gt=0.0, lt=1.0) | conlist(_Codec, max_items=MAX_PEERS_PER_ASSIGNMENT)
              | conlist(conlist(_Codec, max_items=MAX_PEERS_PER_ASSIGNMENT), max_items=MAX_PEERS_PER_ASSIGNMENT) | None)
"""A WireFormat field's value: a codec, a density, or the per-link lists; `Assignment._consistent` checks the whole."""
_LayerRange = conlist(conint(strict=True, ge=0, le=MAX_LAYERS), min_items=2, max_items=2)
"""[a, b): a reader may expand it layer by layer, so its ends are bounded (and `_ordered` checks a < b)."""


def _ordered(layers: list[int]) -> list[int]:
    if layers[0] >= layers[1]:
        raise ValueError(f"layer range {layers} is empty")
    return layers
_Version = conint(strict=True, ge=1, le=MAX_STEP)
_Sha256 = constr(strict=True, regex=r"^[0-9a-f]{64}$")


class _Record(pydantic.BaseModel):
    class Config:
        extra = pydantic.Extra.forbid
        allow_mutation = False


class LinkMeasurement(_Record):
    """One measured link, from the publisher to another peer."""

    latency_ms: confloat(strict=True, ge=0.0, le=MAX_LATENCY_MS)
    """One-way latency, published as RTT / 2."""
    bandwidth_mbps: confloat(strict=True, gt=0.0, le=MAX_BANDWIDTH_MBPS)
    measured_at: _Timestamp
    """hivemind DHT time of the measurement."""
    samples: conint(strict=True, ge=1, le=1_000_000)


class Hardware(_Record):
    device: _Name
    """torch device string the client trains on, e.g. "cuda:0" or "cpu"."""
    device_name: constr(strict=True, max_length=128)
    tflops: confloat(strict=True, ge=0.0, le=MAX_TFLOPS)
    dtype: Literal["bfloat16", "float16", "float32"]
    """The dtype the TFLOPS figure was measured in."""
    memory_gib: confloat(strict=True, ge=0.0, le=MAX_MEMORY_GIB)


class PeerRole(_Record):
    stage: conint(strict=True, ge=0, lt=MAX_PEERS_PER_ASSIGNMENT)
    replica: conint(strict=True, ge=0, lt=MAX_PEERS_PER_ASSIGNMENT)


class CheckpointInfo(_Record):
    """A checkpoint a peer holds on disk: the state of layers [a, b) ready for `step`
    (client/training/checkpoints.py)."""

    step: conint(strict=True, ge=1, le=MAX_STEP)
    layers: _LayerRange
    plan_version: conint(strict=True, ge=0, le=MAX_STEP) = 0
    """The plan it was written under: after a plan goes back to an earlier step, checkpoints of later steps written
    under older plans are of an abandoned trajectory (coordinator/state_plan.py)."""
    root: _Sha256 | None = None
    """`units_root` of its units' digests (client/training/stage_state.py); None for a checkpoint written before
    checkpoints had one. The coordinator records the root a plan's named saver publishes, and resumes only from
    checkpoints with recorded roots (coordinator/checkpoint_ledger.py)."""

    _layers_ordered = pydantic.validator("layers", allow_reuse=True)(_ordered)


class PeerRecord(_Record):
    """What a volunteer says about itself; refreshed every T/2 and expiring after T when it falls silent."""

    peer_id: _PeerIdStr
    maddrs: conlist(constr(strict=True, max_length=256), max_items=16)
    version: _Name
    hardware: Hardware
    links: dict[_PeerIdStr, LinkMeasurement] = pydantic.Field(default_factory=dict)
    state: PeerState
    public_name: _Name | None = None
    site: _Name | None = None
    """Emulated site (--emulate ... --site NAME), None on real links."""
    assignment_version: _Version | None = None
    """Version of the pinned coordinator's plan this peer follows; None before it has accepted one."""
    role: PeerRole | None = None
    """This peer's (stage, replica) in that plan; None while a standby."""
    checkpointing: StrictBool = False
    """Whether this peer writes checkpoints when the plan asks it to (`hetswarm join --checkpoint-dir`)."""
    checkpoints: conlist(CheckpointInfo, max_items=MAX_CHECKPOINTS_PER_RECORD) = pydantic.Field(default_factory=list)
    """The checkpoints of this swarm it holds, newest first; a swarm whose replicas of some layers are all gone
    resumes from them."""
    join_token: constr(strict=True, max_length=MAX_TOKEN_CHARS) | None = None
    """The coordinator's signature that admits this peer to a closed swarm (protocol/join_tokens.py)."""
    updated_at: _Timestamp

    @pydantic.validator("links")
    def _bounded_links(cls, links: dict) -> dict:
        if len(links) > MAX_LINKS_PER_RECORD:
            raise ValueError(f"{len(links)} links exceed the limit of {MAX_LINKS_PER_RECORD}")
        return links


class CheckpointRoot(_Record):
    """The root the coordinator recorded for the checkpoint of `layers` its saver wrote (CheckpointInfo.root)."""

    layers: _LayerRange
    root: _Sha256

    _layers_ordered = pydantic.validator("layers", allow_reuse=True)(_ordered)


class Handoff(_Record):
    """Where the state of a plan that starts mid-run comes from (client/training/state_handoff.py)."""

    sources: conlist(_PeerIdStr, max_items=MAX_PEERS_PER_ASSIGNMENT)
    """Peers that hold the state ready for the plan's step (replicas of the previous plan, or checkpoint holders);
    a peer that does not hold its stage's state at that step fetches it from them and from the plan's peers."""
    seeded_layers: conlist(_LayerRange, max_items=MAX_PEERS_PER_ASSIGNMENT) = pydantic.Field(default_factory=list)
    """Layer ranges no peer holds any more (no replica, no checkpoint): they start again from the seed."""
    resumed_from_checkpoint: StrictBool = False
    checkpoint_roots: conlist(CheckpointRoot, max_items=MAX_PEERS_PER_ASSIGNMENT) = pydantic.Field(
        default_factory=list)
    """For a resume: the recorded roots of the checkpoints it resumes from, which every unit downloaded must match;
    empty when the coordinator recorded none (its state was lost), and then the holders' majority decides."""

    _seeded_ordered = pydantic.validator("seeded_layers", each_item=True, allow_reuse=True)(_ordered)


class CheckpointPlan(_Record):
    """Who writes checkpoints and how often: one replica per stage is enough."""

    savers: conlist(_PeerIdStr | None, max_items=MAX_PEERS_PER_ASSIGNMENT)
    """Stage s's saver, or None when no replica of that stage keeps checkpoints."""
    every: conint(strict=True, ge=1, le=MAX_STEP)
    """Steps between checkpoints: a checkpoint is written of the state ready for each step that is a multiple of
    this, so that the stages' checkpoints meet at the same steps."""


class BottleneckHop(_Record):
    """The plan's slowest pipeline hop, as the coordinator priced it when it published the plan: on the links it
    saw then, for the bytes the plan's wire sends (coordinator/assignment_record.py). The monitor shows this price;
    it does not price the plan again."""

    stage: conint(strict=True, ge=0, le=MAX_PEERS_PER_ASSIGNMENT)
    """The hop from this stage to the next ..."""
    pipeline: conint(strict=True, ge=0, le=MAX_PEERS_PER_ASSIGNMENT)
    """... in this pipeline."""
    latency_ms: confloat(strict=True, ge=0.0, le=MAX_LATENCY_MS)
    bandwidth_mbps: confloat(strict=True, gt=0.0, le=MAX_BANDWIDTH_MBPS)
    estimated: StrictBool
    """The link was not measured: its figures are the coordinator's estimate (coordinator/swarm_view.py)."""
    micro_batch_s: _Seconds
    """One micro-batch's activations (or gradients) across it: the live model's hop term (coordinator/scheduling/live_cost.py)."""


class Assignment(_Record):
    """The plan every client follows, signed by the coordinator whose key the clients pinned."""

    coordinator_id: _PeerIdStr
    version: _Version
    """Monotonic: a client never goes back to an older plan."""
    model: dict[StrictStr, StrictBool | StrictInt | confloat(strict=True, allow_inf_nan=False) | StrictStr | None]
    """ModelConfig fields (hetswarm.protocol.model_config)."""
    d_pp: conint(strict=True, ge=1, le=MAX_PEERS_PER_ASSIGNMENT)
    d_dp: conint(strict=True, ge=1, le=MAX_PEERS_PER_ASSIGNMENT)
    stage_layers: list[conlist(StrictInt, min_items=2, max_items=2)]
    roles: dict[_PeerIdStr, PeerRole]
    pipelines: list[list[_PeerIdStr]]
    """Pipeline i: the peer of each stage, in stage order."""
    predicted_step_s: _Seconds
    breakdown: dict[constr(strict=True, max_length=64), _Seconds]
    micro_batches: conint(strict=True, ge=1, le=MAX_STEP)
    recompute: StrictBool = False
    """Stages recompute their activations in the backward pass instead of keeping them (coordinator/scheduling/live_cost.py,
    Execution): the plan's way to fit stages into its peers' memory."""
    schedule: PipelineSchedule = "gpipe"
    """1F1B holds fewer micro-batches' activations at once than GPipe, for the same step time (coordinator/scheduling/live_cost.py,
    Memory)."""
    step: _Step
    """Optimizer step the plan starts at (learning-rate schedule position): a ReadyStep (protocol/keys.py)."""
    reason: constr(strict=True, max_length=256)
    issued_at: _Timestamp
    handoff: Handoff | None = None
    """None: every stage starts from the seed (a fresh run)."""
    checkpoints: CheckpointPlan | None = None
    aggregation: Aggregation = "mean"
    """How stage groups combine gradients: the mean, or CenteredClip for open swarms."""
    wire: dict[_Name, _WireValue] | None = None
    """WireFormat fields, the codec of each transfer (protocol/wire_format.py); None: the model config's byte
    widths."""
    eval_every: _Step = 0
    """Every pipeline measures its loss on the held-out set after each step s with (s + 1) % eval_every == 0; 0:
    never (client/training/stage_worker.py)."""
    bottleneck: BottleneckHop | None = None
    """None: a single stage, or a coordinator of an older version."""

    def model_config(self) -> ModelConfig:
        """The plan's model, typed, with the plan's micro-batch count; the one place a wire model is parsed.

        Raises:
            TypeError, ValueError: the model fields do not make a ModelConfig.
        """
        return replace(ModelConfig.from_dict(self.model), micro_batches=self.micro_batches)

    def wire_format(self) -> WireFormat:
        """The codecs every peer of this plan sends and expects.

        Raises:
            TypeError, ValueError: the model fields do not make a ModelConfig.
        """
        return WireFormat.from_dict(self.wire) if self.wire is not None else WireFormat.of_model(self.model_config())

    @pydantic.root_validator(skip_on_failure=True)
    def _consistent(cls, values: dict) -> dict:
        d_pp, d_dp, roles, pipelines = values["d_pp"], values["d_dp"], values["roles"], values["pipelines"]
        if len(roles) > MAX_PEERS_PER_ASSIGNMENT:
            raise ValueError(f"{len(roles)} peers exceed the limit of {MAX_PEERS_PER_ASSIGNMENT}")
        if len(values["stage_layers"]) != d_pp or len(pipelines) != d_dp:
            raise ValueError(f"expected {d_pp} stage layer ranges and {d_dp} pipelines")
        for replica, chain in enumerate(pipelines):
            if len(chain) != d_pp:
                raise ValueError(f"pipeline {replica} has {len(chain)} peers, expected {d_pp}")
            for stage, peer in enumerate(chain):
                role = roles.get(peer)
                if role is None or (role.stage, role.replica) != (stage, replica):
                    raise ValueError(f"pipeline {replica} stage {stage}: {peer} has no matching role")
        bottleneck = values.get("bottleneck")
        if bottleneck is not None and not (bottleneck.stage < d_pp - 1 and bottleneck.pipeline < d_dp):
            raise ValueError(f"bottleneck hop {bottleneck.stage}→{bottleneck.stage + 1} of pipeline "
                             f"{bottleneck.pipeline} is not a hop of a {d_dp}×{d_pp} plan")
        checkpoints = values.get("checkpoints")
        if checkpoints is not None and len(checkpoints.savers) != d_pp:
            raise ValueError(f"expected a checkpoint saver entry for each of {d_pp} stages")
        wire = values.get("wire")
        if wire is not None and not WireFormat.from_dict(wire).fits(d_pp, d_dp):
            raise ValueError(f"the wire's per-link codecs are not one per hop and per stage group of a "
                             f"{d_dp}×{d_pp} plan")
        return values


class Progress(_Record):
    """A training client's latest step, for the monitor and the coordinator's measured-vs-predicted check, and its
    health: a peer that cannot train says so at once, with the reason and the peers it could not reach, so that the
    coordinator can act before those peers' records expire."""

    peer_id: _PeerIdStr
    assignment_version: _Step
    step: _Step
    """With health `training`, the last step this peer committed (an AppliedStep, protocol/keys.py); otherwise the
    step it is stuck at (a ReadyStep). `applied` reads it either way."""
    loss: confloat(strict=True, ge=0.0, le=MAX_LOSS) | None
    """Mean token cross-entropy of the last step; only last-stage peers compute it."""
    recent_losses: conlist(confloat(strict=True, ge=0.0, le=MAX_LOSS), max_items=MAX_RECENT_LOSSES) = pydantic.Field(
        default_factory=list)
    """The losses of the last steps up to `step`, oldest first (the last is `loss`): readers that look once a
    second still see every step's (coordinator/loss_watch.py)."""
    held_out_loss: confloat(strict=True, ge=0.0, le=MAX_LOSS) | None = None
    """The pipeline's latest loss on the held-out set (last stage only), measured after step `held_out_step`."""
    held_out_step: _Step | None = None
    tokens_per_s: confloat(strict=True, ge=0.0, le=1e12)
    compute_s: _Seconds
    wait_s: _Seconds
    window_s: _Seconds | None = None
    """How long this peer held its upstream neighbour's micro-batches in its last step (client/training/stage_passes.py,
    StepReport); None on a first stage."""
    round_trip_s: _Seconds | None = None
    """How long its micro-batches took to come back from its downstream neighbour in its last step; None on a last
    stage. With the window, the coordinator bounds a member's compute by what its neighbours measured
    (coordinator/claims.py)."""
    retries: _Step = 0
    """Aborted attempts of this peer's stage worker so far (all-or-nothing steps retry under new attempts)."""
    resyncs: _Step = 0
    """Times this replica's state differed from its stage group's and was replaced."""
    health: Health = "training"
    reason: constr(strict=True, max_length=256) | None = None
    """Why this peer is retrying or stalled."""
    unreachable: conlist(_PeerIdStr, max_items=MAX_UNREACHABLE_PER_RECORD) = pydantic.Field(default_factory=list)
    """Peers of the plan that this peer could not reach or hear from in its last failed attempt."""
    aborted: conlist(AbortedAttempt, max_items=MAX_ABORTED_PER_RECORD) = pydantic.Field(default_factory=list)
    """The signed failure votes of the last attempts the plan aborted at `step`: evidence of who stops the plan
    from committing (coordinator/failure_votes.py), checked by the coordinator, not taken on this peer's word."""
    state_origin: StateOrigin | None = None
    """Where this peer's stage state came from when the plan started."""
    handoff_bytes: conint(strict=True, ge=0, le=2**50) = 0
    """Bytes this peer downloaded to take over its stage under this plan (0 when it kept or seeded it)."""
    handoff_s: _Seconds = 0.0
    updated_at: _Timestamp

    @property
    def applied(self) -> AppliedStep:
        """The last step this peer applied: its `step` while training, the one before the step it is stuck at
        otherwise (-1: none yet)."""
        return self.step if self.health == "training" else self.step - 1


class Refusals(_Record):
    """The peers the coordinator does not plan, and why (not admitted, reported unreachable), and those it plans
    by what they do rather than what they claim (coordinator/claims.py), for the monitor and the peers
    themselves."""

    coordinator_id: _PeerIdStr
    refused: dict[_PeerIdStr, constr(strict=True, max_length=160)]
    flagged: dict[_PeerIdStr, constr(strict=True, max_length=160)] = pydantic.Field(default_factory=dict)
    updated_at: _Timestamp

    @pydantic.validator("refused", "flagged")
    def _bounded(cls, peers: dict) -> dict:
        if len(peers) > MAX_REFUSED_PER_RECORD:
            raise ValueError(f"{len(peers)} peers exceed the limit of {MAX_REFUSED_PER_RECORD}")
        return peers


class LinkRequests(_Record):
    """Links the coordinator asks to be measured before it publishes a plan that relies on them: they were
    estimated (coordinator/link_estimate.py). Each pair is (measurer, target): the coordinator chooses the end
    that measures, so that no peer has many links to probe one after another (coordinator/measurement_wait.py);
    the measurer probes the link as its plan's partners, and the coordinator then prices the plan on the
    measurements."""

    coordinator_id: _PeerIdStr
    pairs: list[tuple[_PeerIdStr, _PeerIdStr]]
    updated_at: _Timestamp

    @pydantic.validator("pairs")
    def _bounded(cls, pairs: list) -> list:
        if len(pairs) > MAX_REQUESTED_LINKS:
            raise ValueError(f"{len(pairs)} links exceed the limit of {MAX_REQUESTED_LINKS}")
        if any(a == b for a, b in pairs):
            raise ValueError("a link joins two different peers")
        return pairs

    def targets_of(self, peer: PeerId) -> frozenset[PeerId]:
        """The peers whose link with `peer` the coordinator asks `peer` to measure."""
        return frozenset(target for measurer, target in self.pairs if measurer == peer)
