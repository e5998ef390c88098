"""How a plan's tensors travel: the codec of each kind of transfer, and the bytes per value the cost model prices.

Three transfers cross the network every step (design.md, data flow): activations forward between neighbouring
stages, their gradients backward, and each stage group's gradient all-reduce. Each is sent in one codec:

 * ``fp32`` - as computed, no loss;
 * ``fp16`` - cast to half precision: a relative error of at most 2^-11 within fp16's range;
 * ``8bit`` - blockwise absmax quantization: each block of 256 values as its largest magnitude m and one int8 per
   value, an error of at most m/254 (protocol/codecs.py); 1.016 bytes per value;
 * ``4bit``, ``2bit`` - the same with 7 and 1 levels each side of zero, for activation deltas only.

Activation deltas (AQ-SGD: Wang et al. 2022, "Fine-tuning Language Models over Slow Networks using Activation
Compression with Guarantees") send, for a sample the link has carried before, only the change of its activation
since then, in 4 or 2 bits: both ends keep the last activation of each sample (client/training/activation_deltas.py).
It needs samples that recur, which ``ModelConfig.data_period`` gives; the first pass over them is sent whole.

A sparse all-reduce (``allreduce_density``) averages, each step, only a random sample of the gradient's blocks of
SAMPLE_BLOCK_VALUES values, the same on every member and drawn from the step alone, so no indices travel; the
values not sent wait in the error-feedback residual for a later step (random-k with memory: Stich et al. 2018,
"Sparsified SGD with Memory"; CocktailSGD, Wang et al. 2023, samples at random the same way before quantizing).

The coordinator chooses the codecs with a policy (``CompressionPolicy``) and the plan carries them
(``Assignment.wire``). Compressed gradients of the all-reduce keep their quantization error and add it to the next
step's (error feedback, client/training/error_feedback.py), so that compression delays a gradient's information but
does not lose it. Pure Python: the scheduler prices a wire without importing torch.
"""
from __future__ import annotations

from typing import Literal

import pydantic.v1 as pydantic

from hetswarm.protocol.model_config import ModelConfig

__all__ = ["BLOCK_VALUES", "BYTES_PER_VALUE", "CODECS", "COMPRESSION_POLICIES", "DELTA_CODECS", "Codec",
           "CompressionPolicy", "SAMPLE_BLOCK_VALUES", "SPARSE_DENSITY", "WireFormat", "candidate_wires"]

Codec = Literal["fp32", "fp16", "8bit", "4bit", "2bit"]
CODECS: tuple[Codec, ...] = ("fp32", "fp16", "8bit")
"""The codecs a whole tensor is sent in, from the least to the most lossy."""
DELTA_CODECS: tuple[Codec, ...] = ("4bit", "2bit")
"""The codecs of activation deltas (a change is small, so fewer levels lose little; AQ-SGD sends 2 to 4 bits)."""

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

CompressionPolicy = Literal["model", "none", "fp16", "8bit", "auto", "aq-sgd", "sparse"]
COMPRESSION_POLICIES: tuple[CompressionPolicy, ...] = ("model", "none", "fp16", "8bit", "auto", "aq-sgd", "sparse")
"""`model`: the model config's byte widths (2 → fp16 activations, 4 → fp32 gradients); `none`: fp32 everywhere;
`fp16`, `8bit`: that codec everywhere; `auto`: per plan, the least lossy wire whose predicted step time is within
AUTO_TOLERANCE of the fastest (coordinator/planner.py); `aq-sgd`: 8-bit everywhere and 4-bit activation deltas (the
model config needs a data_period); `sparse`: 8-bit everywhere and an all-reduce of a random SPARSE_DENSITY of the
gradient per step."""

AUTO_TOLERANCE = 0.05


class WireFormat(pydantic.BaseModel):
    """The codec of each transfer of a plan; part of the Assignment, so every peer sends and expects the same."""

    activations: Codec
    gradients: Codec
    """Activation gradients, sent backward along the pipeline."""
    allreduce: Codec
    """The stage group's gradient all-reduce."""
    activation_deltas: Codec | None = None
    """When set, an activation of a sample the link carried before is sent as its change in this codec (AQ-SGD);
    `activations` is then the codec of the first pass."""
    allreduce_density: pydantic.confloat(strict=True, gt=0, lt=1) | None = None
    """When set, the share of the gradient's values the all-reduce sends each step, a random sample of blocks drawn
    alike by every member (module docstring); the rest waits in the error-feedback residual."""

    class Config:
        extra = pydantic.Extra.forbid
        allow_mutation = False

    @pydantic.validator("activations", "gradients", "allreduce")
    def _whole(cls, codec: Codec) -> Codec:
        if codec not in CODECS:
            raise ValueError(f"{codec} is for activation deltas only; whole tensors travel as {', '.join(CODECS)}")
        return codec

    @pydantic.validator("activation_deltas")
    def _delta(cls, codec: Codec | None) -> Codec | None:
        if codec is not None and codec not in DELTA_CODECS:
            raise ValueError(f"activation deltas travel as {' or '.join(DELTA_CODECS)}, not {codec}")
        return codec

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
        """Mean width of a value sent forward and of its gradient sent back: the paper's model counts one c_PP each
        way (2·PipeP), and a link's time is linear in the bytes, so the mean prices both exactly."""
        forward = self.activation_deltas or self.activations  # deltas: from the second pass on, as planned for
        return (BYTES_PER_VALUE[forward] + BYTES_PER_VALUE[self.gradients]) / 2

    @property
    def allreduce_bytes_per_value(self) -> float:
        """Per value of the gradient: a sparse all-reduce sends only its sample, and no indices."""
        return BYTES_PER_VALUE[self.allreduce] * (self.allreduce_density or 1.0)

    def describe(self) -> str:
        if self.activations == self.gradients == self.allreduce:
            whole = f"{self.activations} everywhere"
        else:
            whole = f"{self.activations} activations, {self.gradients} activation gradients, {self.allreduce} all-reduce"
        deltas = f", {self.activation_deltas} activation deltas" if self.activation_deltas else ""
        sparse = f", all-reduce of {self.allreduce_density:.3g} of the gradient per step" if self.allreduce_density else ""
        return whole + deltas + sparse


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
    return [WireFormat.uniform(policy)]
