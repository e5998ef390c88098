"""How a plan's tensors travel: the codec of each kind of transfer, and the bytes per value the cost model prices.

Three transfers cross the network every step (design.md, data flow): activations forward between neighbouring
stages, their gradients backward, and each stage group's gradient all-reduce. Each is sent in one codec:

 * ``fp32`` - as computed, no loss;
 * ``fp16`` - cast to half precision: a relative error of at most 2^-11 within fp16's range;
 * ``8bit`` - hivemind's uniform 8-bit quantization (mean ± 3 standard deviations in 256 buckets, each bucket sent
   as the mean of its values): one byte per value and a 1 KiB codebook per message. The error of a value inside the
   range is at most one bucket, 6σ/256; values at its edges share their edge bucket's mean (protocol/codecs.py).

The coordinator chooses the codecs with a policy (``CompressionPolicy``) and the plan carries them
(``Assignment.wire``). Compressed gradients of the all-reduce keep their quantization error and add it to the next
step's (error feedback, client/training/error_feedback.py), so that compression delays a gradient's information but
does not lose it. Pure Python: the scheduler prices a wire without importing torch.
"""
from __future__ import annotations

from typing import Literal

import pydantic.v1 as pydantic

from hetswarm.protocol.model_config import ModelConfig

__all__ = ["BYTES_PER_VALUE", "CODECS", "CODEBOOK_BYTES", "COMPRESSION_POLICIES", "Codec", "CompressionPolicy",
           "WireFormat", "candidate_wires"]

Codec = Literal["fp32", "fp16", "8bit"]
CODECS: tuple[Codec, ...] = ("fp32", "fp16", "8bit")
"""From the least to the most lossy."""

BYTES_PER_VALUE: dict[Codec, int] = {"fp32": 4, "fp16": 2, "8bit": 1}
CODEBOOK_BYTES = 8 + 256 * 4
"""What an 8-bit message carries besides its values: the codebook's length and its 256 float32 entries
(hivemind/compression/quantization.py)."""

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
        by_width = {width: codec for codec, width in BYTES_PER_VALUE.items()}
        pipeline = by_width.get(model.activation_bytes_per_value, "fp32")
        return cls(activations=pipeline, gradients=pipeline, allreduce=by_width.get(model.grad_bytes_per_param, "fp32"))

    @property
    def pipeline_bytes_per_value(self) -> float:
        """Mean width of a value sent forward and of its gradient sent back: the paper's model counts one c_PP each
        way (2·PipeP), and a link's time is linear in the bytes, so the mean prices both exactly."""
        return (BYTES_PER_VALUE[self.activations] + BYTES_PER_VALUE[self.gradients]) / 2

    @property
    def pipeline_overhead_bytes(self) -> float:
        """Bytes a frame carries besides its values (an 8-bit codebook), as the mean of the two directions."""
        return sum(CODEBOOK_BYTES for codec in (self.activations, self.gradients) if codec == "8bit") / 2

    @property
    def allreduce_bytes_per_value(self) -> float:
        return float(BYTES_PER_VALUE[self.allreduce])

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
