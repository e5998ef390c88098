"""How a plan's tensors travel: the codec of each kind of transfer, and the bytes per value the cost model prices.

Three transfers cross the network every step (design.md, data flow): activations forward between neighbouring
stages, their gradients backward, and each stage group's gradient all-reduce. Each is sent in one codec:

 * ``fp32`` - as computed, no loss;
 * ``fp16`` - cast to half precision: a relative error of at most 2^-11 within fp16's range;
 * ``8bit`` - blockwise absmax quantization: each block of 256 values as its largest magnitude m and one int8 per
   value, an error of at most m/254 (protocol/codecs.py); 1.016 bytes per value;
 * ``4bit``, ``2bit`` - the same with 7 and 1 levels each side of zero: ``4bit`` for activation deltas and
   activation gradients, ``2bit`` for activation deltas only.

Activation deltas (AQ-SGD: Wang et al. 2022, "Fine-tuning Language Models over Slow Networks using Activation
Compression with Guarantees") send, for a sample the link has carried before, only the change of its activation
since then, in 4 or 2 bits: both ends keep the last activation of each sample (client/training/activation_deltas.py).
It needs samples that recur, which ``ModelConfig.data_period`` gives; the first pass over them is sent whole.
Activation gradients do not recur, so they go whole, in as few as 4 bits (AQ-SGD's lightest backward, "bw4"): the
`aq-powersgd` policy sends them so, rounded at random (ROUNDED_AT_RANDOM).

A sparse all-reduce (``allreduce_density``) averages, each step, only a random sample of the gradient's blocks of
SAMPLE_BLOCK_VALUES values, the same on every member and drawn from the step alone, so no indices travel; the
values not sent wait in the error-feedback residual for a later step (random-k with memory: Stich et al. 2018,
"Sparsified SGD with Memory"; CocktailSGD, Wang et al. 2023, samples at random the same way before quantizing).
A low-rank all-reduce (``allreduce_low_rank``) sends each gradient matrix as two thin factors whose values are that
share of the matrix's, in two rounds a step, and the rest waits in the residual too (PowerSGD: Vogels et al. 2019,
"PowerSGD: Practical Low-Rank Gradient Compression for Distributed Optimization"; client/training/low_rank.py).
A random sample loses much of what the model learns early, low-rank factors little (benchmarks/gradient_options.py
trains the tiny model with each; its numbers are in benchmarks/RESULTS.md).

The coordinator chooses the codecs with a policy (``CompressionPolicy``) and the plan carries them
(``Assignment.wire``). Under `auto` the choice is per link: each pipeline hop and each stage group's all-reduce
gets the least lossy codec that keeps the plan's predicted step near its fastest
(coordinator/scheduling/wire_choice.py), so a fast hop inside a site keeps full precision while a slow one between
regions goes 8-bit. Compressed gradients of
the all-reduce keep their quantization error and add it to the next step's (error feedback,
client/training/error_feedback.py), so that compression delays a gradient's information but does not lose it.

Pure Python, without pydantic: the scheduler and `hetswarm schedule` price a wire on a laptop; the assignment
record (protocol/records.py) checks a received wire with `WireFormat.from_dict`.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from typing import Any, Literal

from hetswarm.protocol.model_config import ModelConfig

__all__ = ["ACTIVATION_GRADIENT_CODECS", "BLOCK_VALUES", "BYTES_PER_VALUE", "CODECS", "COMPRESSION_POLICIES",
           "DELTA_CODECS", "DELTA_POLICIES", "Codec", "CompressionPolicy", "LOW_RANK_SHARE", "ROUNDED_AT_RANDOM",
           "SAMPLE_BLOCK_VALUES", "SPARSE_DENSITY", "WireFormat", "candidate_wires"]

Codec = Literal["fp32", "fp16", "8bit", "4bit", "2bit"]
CODECS: tuple[Codec, ...] = ("fp32", "fp16", "8bit")
"""The codecs a whole tensor is sent in, from the least to the most lossy."""
DELTA_CODECS: tuple[Codec, ...] = ("4bit", "2bit")
"""The codecs of activation deltas (a change is small, so fewer levels lose little; AQ-SGD sends 2 to 4 bits)."""
ACTIVATION_GRADIENT_CODECS: tuple[Codec, ...] = (*CODECS, "4bit")
"""The codecs of activation gradients sent backward: AQ-SGD sends them in 4 to 8 bits, twice its forward deltas'."""
ROUNDED_AT_RANDOM: tuple[Codec, ...] = ("4bit",)
"""Activation gradients in these codecs are rounded at random, unbiased (protocol/codecs.py), each frame's rounding
drawn from its place in the run (stage, pipeline, step, micro-batch), so a retried step sends the same bytes. Rounded
to the nearest level, 4-bit gradients stall the end of training: in benchmarks/activation_wire.py's 300 steps of the
bandwidth-bound layout's model (RESULTS.md `activation-gradient-rounding`), the last 20 steps' loss +42 % over 8-bit
gradients, +6 % rounded at random."""

BLOCK_VALUES = 256
"""Values per block of the 8-bit codec, each block sent with its float32 scale."""
BYTES_PER_VALUE: dict[Codec, float] = {"fp32": 4.0, "fp16": 2.0, "8bit": 1 + 4 / BLOCK_VALUES,
                                       "4bit": 0.5 + 4 / BLOCK_VALUES, "2bit": 0.25 + 4 / BLOCK_VALUES}

SAMPLE_BLOCK_VALUES = BLOCK_VALUES
"""Values per block a sparse all-reduce samples: consecutive values, so drawing the sample is cheap and each block
sent fills one block of the 8-bit codec."""
SPARSE_DENSITY = 1 / 16
"""The share of the gradient the `sparse` policy's all-reduce sends each step: every value is sent, on average,
once in 16 steps; with 8-bit values, 63 times fewer bytes than fp32."""
LOW_RANK_SHARE = 1 / 4
"""The share of a gradient matrix's values the `powersgd` and `aq-powersgd` policies' factors hold: with 8-bit
values, about 15 times fewer bytes than fp32 (the norms' and biases' vectors travel whole)."""

CompressionPolicy = Literal["model", "none", "fp16", "8bit", "auto", "aq-sgd", "sparse", "powersgd", "aq-powersgd"]
COMPRESSION_POLICIES: tuple[CompressionPolicy, ...] = ("model", "none", "fp16", "8bit", "auto", "aq-sgd", "sparse",
                                                       "powersgd", "aq-powersgd")
"""`model`: the model config's byte widths (2 → fp16 activations, 4 → fp32 gradients); `none`: fp32 everywhere;
`fp16`, `8bit`: that codec everywhere; `auto`: per link, the least lossy codecs that keep the predicted step time
within AUTO_TOLERANCE of the fastest (coordinator/scheduling/wire_choice.py); `aq-sgd`: 8-bit everywhere and 4-bit
activation deltas (the model config needs a data_period); `sparse`: 8-bit everywhere and an all-reduce of a random
SPARSE_DENSITY of the gradient per step; `powersgd`: 8-bit everywhere and an all-reduce of low-rank factors holding
LOW_RANK_SHARE of each gradient matrix; `aq-powersgd`: both at once, for links where bytes are most of the step -
8-bit activations and 4-bit activation deltas, 4-bit activation gradients, and an 8-bit all-reduce of low-rank
factors holding LOW_RANK_SHARE of each matrix (1/2 measured slower: its factors' CPU; benchmarks/RESULTS.md,
`compression-aq-powersgd`)."""
DELTA_POLICIES: tuple[CompressionPolicy, ...] = ("aq-sgd", "aq-powersgd")
"""The policies that send activation deltas, and so need a data order that repeats."""

AUTO_TOLERANCE = 0.05


@dataclass(frozen=True, kw_only=True, slots=True)
class WireFormat:
    """The codec of each transfer of a plan; part of the Assignment, so every peer sends and expects the same."""

    activations: Codec
    gradients: Codec
    """Activation gradients, sent backward along the pipeline."""
    allreduce: Codec
    """The stage group's gradient all-reduce."""
    activation_deltas: Codec | None = None
    """When set, an activation of a sample the link carried before is sent as its change in this codec (AQ-SGD);
    the hop's whole codec is then the codec of the first pass."""
    allreduce_density: float | None = None
    """When set, the share of the gradient's values the all-reduce sends each step, a random sample of blocks drawn
    alike by every member (module docstring); the rest waits in the error-feedback residual."""
    allreduce_low_rank: float | None = None
    """When set, each gradient matrix is all-reduced as low-rank factors holding this share of its values (module
    docstring); vectors travel whole, and the rest of a matrix waits in the error-feedback residual."""
    hops: tuple[tuple[Codec, ...], ...] | None = None
    """Per link: hops[s][r] is the codec of activations and their gradients on the hop from stage s to s + 1 of
    pipeline r; None: `activations` and `gradients` on every hop."""
    groups: tuple[Codec, ...] | None = None
    """Per stage group: groups[s] is the codec of stage s's all-reduce; None: `allreduce` in every group."""

    def __post_init__(self) -> None:
        for name in ("activations", "allreduce"):
            _check_codec(name, getattr(self, name), CODECS)
        _check_codec("gradients", self.gradients, ACTIVATION_GRADIENT_CODECS)
        if self.activation_deltas is not None:
            _check_codec("activation_deltas", self.activation_deltas, DELTA_CODECS)
        for name in ("allreduce_density", "allreduce_low_rank"):
            share = getattr(self, name)
            if share is not None and (type(share) is not float or not 0 < share < 1):
                raise ValueError(f"{name} must be a float strictly between 0 and 1, got {share!r}")
        if self.allreduce_density is not None and self.allreduce_low_rank is not None:
            raise ValueError("an all-reduce sends a sample (allreduce_density) or factors (allreduce_low_rank), "
                             "not both")
        if self.hops is not None:
            if not isinstance(self.hops, tuple) or not self.hops or len({len(row) for row in self.hops}) != 1:
                raise ValueError("hops must be one equally long, non-empty row of codecs per stage boundary")
            for row in self.hops:
                _check_codecs("hops", row)
        if self.groups is not None:
            _check_codecs("groups", self.groups)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> WireFormat:
        """A wire from its JSON form (`to_dict`), as a peer's record carries it.

        Raises:
            ValueError: an unknown field, a missing one, or a value outside the codecs.
        """
        known = {field.name for field in fields(cls)}
        if unknown := sorted(set(data) - known):
            raise ValueError(f"unknown wire fields: {', '.join(map(str, unknown))}")
        if missing := sorted({"activations", "gradients", "allreduce"} - set(data)):
            raise ValueError(f"the wire lacks {', '.join(missing)}")
        values = dict(data)
        if isinstance(values.get("hops"), list) and all(isinstance(row, list) for row in values["hops"]):
            values["hops"] = tuple(tuple(row) for row in values["hops"])
        if isinstance(values.get("groups"), list):
            values["groups"] = tuple(values["groups"])
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready; the per-link and low-rank fields only when set, so a plan without them reads as before."""
        data = {field.name: getattr(self, field.name) for field in fields(self)}
        for name in ("hops", "groups", "allreduce_low_rank"):
            if data[name] is None:
                del data[name]
        return {name: _as_lists(value) if isinstance(value, tuple) else value for name, value in data.items()}

    @property
    def per_link(self) -> bool:
        return self.hops is not None or self.groups is not None

    def hop_codec(self, kind: str, stage: int, pipeline: int) -> Codec:
        """The codec of a whole frame of `kind` (activations or their gradients) on the hop from `stage` to
        `stage + 1` of `pipeline`."""
        if self.hops is not None:
            return self.hops[stage][pipeline]
        return self.gradients if kind == "gradients" else self.activations

    def group_codec(self, stage: int) -> Codec:
        """The codec of stage `stage`'s all-reduce."""
        return self.allreduce if self.groups is None else self.groups[stage]

    def fits(self, d_pp: int, d_dp: int) -> bool:
        """Whether the per-link fields (if any) have one codec per hop and per group of a d_pp × d_dp plan."""
        hops_fit = self.hops is None or (len(self.hops) == d_pp - 1 and len(self.hops[0]) == d_dp)
        return hops_fit and (self.groups is None or len(self.groups) == d_pp)

    @classmethod
    def uniform(cls, codec: Codec) -> "WireFormat":
        return cls(activations=codec, gradients=codec, allreduce=codec)

    @classmethod
    def of_model(cls, model: ModelConfig) -> "WireFormat":
        """What the model config's byte widths say: the wire of the `model` policy (and of older plans)."""
        by_width = {int(BYTES_PER_VALUE[codec]): codec for codec in ("fp32", "fp16")}
        pipeline = by_width.get(model.activation_bytes_per_value, "fp32")
        return cls(activations=pipeline, gradients=pipeline, allreduce=by_width.get(model.grad_bytes_per_param, "fp32"))

    @property
    def pipeline_bytes_per_value(self) -> float:
        """Mean width of a value sent forward and of its gradient sent back, on a hop in `activations` and
        `gradients`: the paper's model counts one c_PP each way (2·PipeP), and a link's time is linear in the bytes,
        so the mean prices both exactly."""
        return self._hop_bytes(self.activations, self.gradients)

    def allreduce_payload_bytes(self, model: ModelConfig, layers: int, *, first: bool, last: bool,
                                stage: int | None = None) -> float:
        """The bytes a stage of `layers` layers all-reduces per step, in stage `stage`'s codec (None: `allreduce`):
        a sparse all-reduce sends only its sample, and no indices; a low-rank one its matrices' factors and its
        vectors whole."""
        codec = self.allreduce if stage is None else self.group_codec(stage)
        whole = model.dp_payload_bytes_of(layers, first=first, last=last, bytes_per_value=BYTES_PER_VALUE[codec])
        if self.allreduce_low_rank is None:
            return whole * (self.allreduce_density or 1.0)
        params = model.params_of(layers, first=first, last=last)
        matrices = model.matrix_params_of(layers, first=first, last=last)
        return whole * (1 - (1 - self.allreduce_low_rank) * matrices / params)

    @property
    def allreduce_rounds(self) -> int:
        """Rounds of each all-reduce per step: a low-rank one averages one factor, then the other."""
        return 1 if self.allreduce_low_rank is None else 2

    def hop_bytes_per_value(self, stage: int, pipeline: int) -> float:
        """`pipeline_bytes_per_value` of one hop, in its own codec."""
        return self._hop_bytes(self.hop_codec("activations", stage, pipeline),
                               self.hop_codec("gradients", stage, pipeline))

    def _hop_bytes(self, activations: Codec, gradients: Codec) -> float:
        forward = self.activation_deltas or activations  # deltas: from the second pass on, as planned for
        return (BYTES_PER_VALUE[forward] + BYTES_PER_VALUE[gradients]) / 2

    def describe(self) -> str:
        if self.activations == self.gradients == self.allreduce:
            whole = f"{self.activations} everywhere"
        else:
            whole = f"{self.activations} activations, {self.gradients} activation gradients, {self.allreduce} all-reduce"
        deltas = f", {self.activation_deltas} activation deltas" if self.activation_deltas else ""
        sparse = ""
        if self.allreduce_density:
            sparse = f", all-reduce of {self.allreduce_density:.3g} of the gradient per step"
        if self.allreduce_low_rank:
            sparse = f", all-reduce of low-rank factors holding {self.allreduce_low_rank:.3g} of each gradient matrix"
        if not self.per_link:
            return whole + deltas + sparse
        hops = _counted(codec for row in self.hops for codec in row) if self.hops else self.activations
        groups = _counted(self.groups) if self.groups else self.allreduce
        return f"per link: hops in {hops}; all-reduces in {groups}" + deltas + sparse


def candidate_wires(policy: CompressionPolicy, model: ModelConfig) -> list[WireFormat]:
    """The wires a policy chooses among, least lossy first (one, except for `auto`)."""
    if policy == "model":
        return [WireFormat.of_model(model)]
    if policy == "none":
        return [WireFormat.uniform("fp32")]
    if policy == "auto":
        return [WireFormat.uniform(codec) for codec in CODECS]
    if policy == "aq-sgd":
        return [WireFormat(activations="8bit", gradients="8bit", allreduce="8bit", activation_deltas="4bit")]
    if policy == "sparse":
        return [WireFormat(activations="8bit", gradients="8bit", allreduce="8bit", allreduce_density=SPARSE_DENSITY)]
    if policy == "powersgd":
        return [WireFormat(activations="8bit", gradients="8bit", allreduce="8bit", allreduce_low_rank=LOW_RANK_SHARE)]
    if policy == "aq-powersgd":
        return [WireFormat(activations="8bit", gradients="4bit", allreduce="8bit", activation_deltas="4bit",
                           allreduce_low_rank=LOW_RANK_SHARE)]
    return [WireFormat.uniform(policy)]


_NARROW_USE = {"4bit": "activation deltas and activation gradients", "2bit": "activation deltas"}
_TRAVELLERS = {CODECS: "whole tensors", ACTIVATION_GRADIENT_CODECS: "activation gradients",
               DELTA_CODECS: "activation deltas"}


def _check_codec(name: str, codec: object, allowed: tuple[Codec, ...]) -> None:
    if codec in allowed:
        return
    narrow = f"{codec} is for {_NARROW_USE[codec]} only; " if codec in _NARROW_USE else f"{codec!r}: "
    raise ValueError(f"{name}: {narrow}{_TRAVELLERS[allowed]} travel as {', '.join(allowed)}")


def _check_codecs(name: str, codecs: object) -> None:
    if not isinstance(codecs, tuple) or not codecs:
        raise ValueError(f"{name} must be a non-empty list of codecs")
    for codec in codecs:
        _check_codec(name, codec, CODECS)


def _as_lists(value: tuple) -> list:
    return [_as_lists(item) if isinstance(item, tuple) else item for item in value]


def _counted(codecs: Iterable[Codec]) -> str:
    """'fp32 ×1, 8bit ×3': how many transfers each codec carries, in CODECS order."""
    counts = {codec: 0 for codec in CODECS}
    for codec in codecs:
        counts[codec] += 1
    return ", ".join(f"{codec} ×{n}" for codec, n in counts.items() if n)
