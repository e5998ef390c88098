"""How a plan's tensors travel: the codec of each kind of transfer, and the bytes per value the cost model prices.

Three transfers cross the network every step (design.md, data flow): activations forward between neighbouring
stages, their gradients backward, and each stage group's gradient all-reduce. Each is sent in one codec:

 * ``fp32`` - as computed, no loss;
 * ``fp16`` - cast to half precision: a relative error of at most 2^-11 within fp16's range;
 * ``8bit`` - blockwise absmax quantization: each block of 256 values as its largest magnitude m and one int8 per
   value, an error of at most m/254 (protocol/codecs.py); 1.016 bytes per value.

The coordinator chooses the codecs with a policy (``CompressionPolicy``) and the plan carries them
(``Assignment.wire``). Compressed gradients of the all-reduce keep their quantization error and add it to the next
step's (error feedback, client/training/error_feedback.py), so that compression delays a gradient's information but
does not lose it. Pure Python: the scheduler prices a wire without importing torch.
"""
from __future__ import annotations

from typing import Literal

import pydantic.v1 as pydantic

from hetswarm.protocol.model_config import ModelConfig

__all__ = ["BLOCK_VALUES", "BYTES_PER_VALUE", "CODECS", "COMPRESSION_POLICIES", "Codec", "CompressionPolicy",
           "WireFormat", "candidate_wires"]

Codec = Literal["fp32", "fp16", "8bit"]
CODECS: tuple[Codec, ...] = ("fp32", "fp16", "8bit")
"""From the least to the most lossy."""

BLOCK_VALUES = 256
"""Values per block of the 8-bit codec, each block sent with its float32 scale."""
BYTES_PER_VALUE: dict[Codec, float] = {"fp32": 4.0, "fp16": 2.0, "8bit": 1 + 4 / BLOCK_VALUES}

CompressionPolicy = Literal["model", "none", "fp16", "8bit", "auto"]
COMPRESSION_POLICIES: tuple[CompressionPolicy, ...] = ("model", "none", "fp16", "8bit", "auto")
"""`model`: the model config's byte widths (2 → fp16 activations, 4 → fp32 gradients); `none`: fp32 everywhere;
`fp16`, `8bit`: that codec everywhere; `auto`: per plan, the least lossy wire whose predicted step time is within
AUTO_TOLERANCE of the fastest (coordinator/planner.py)."""

AUTO_TOLERANCE = 0.05


class WireFormat(pydantic.BaseModel):
    """The codec of each transfer of a plan; part of the Assignment, so every peer sends and expects the same."""

    activations: Codec
    gradients: Codec
    """Activation gradients, sent backward along the pipeline."""
    allreduce: Codec
    """The stage group's gradient all-reduce."""

    class Config:
        extra = pydantic.Extra.forbid
        allow_mutation = False

    @classmethod
    def uniform(cls, codec: Codec) -> "WireFormat":
        return cls(activations=codec, gradients=codec, allreduce=codec)

    @classmethod
    def of_model(cls, model: ModelConfig) -> "WireFormat":
        """What the model config's byte widths say: the wire of the `model` policy (and of older plans)."""
        by_width = {int(width): codec for codec, width in BYTES_PER_VALUE.items() if codec != "8bit"}
        pipeline = by_width.get(model.activation_bytes_per_value, "fp32")
        return cls(activations=pipeline, gradients=pipeline, allreduce=by_width.get(model.grad_bytes_per_param, "fp32"))

    @property
    def pipeline_bytes_per_value(self) -> float:
        """Mean width of a value sent forward and of its gradient sent back: the paper's model counts one c_PP each
        way (2·PipeP), and a link's time is linear in the bytes, so the mean prices both exactly."""
        return (BYTES_PER_VALUE[self.activations] + BYTES_PER_VALUE[self.gradients]) / 2

    @property
    def allreduce_bytes_per_value(self) -> float:
        return BYTES_PER_VALUE[self.allreduce]

    def describe(self) -> str:
        if self.activations == self.gradients == self.allreduce:
            return f"{self.activations} everywhere"
        return f"{self.activations} activations, {self.gradients} activation gradients, {self.allreduce} all-reduce"


def candidate_wires(policy: CompressionPolicy, model: ModelConfig) -> list[WireFormat]:
    """The wires a policy chooses among, least lossy first (one, except for `auto`)."""
    if policy == "model":
        return [WireFormat.of_model(model)]
    if policy == "none":
        return [WireFormat.uniform("fp32")]
    if policy == "auto":
        return [WireFormat.uniform(codec) for codec in CODECS]
    return [WireFormat.uniform(policy)]
