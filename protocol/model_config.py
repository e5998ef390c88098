"""Model shapes the swarm can train, and the byte and FLOP counts the cost model derives from them.

Pure Python: the scheduler and the coordinator price a model without importing torch; the client's torch model
(hetswarm.client.training.model) is built from the same config.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Literal

from hetswarm.protocol.errors import ConfigError
from hetswarm.protocol.units import BYTES_PER_GB, BYTES_PER_GIB

PipelineSchedule = Literal["gpipe", "1f1b"]
"""The order of a stage's forward and backward passes in a step (client/training/pipeline_schedule.py); a plan
chooses it, the model does not, but the scheduler needs the name without the record schemas' pydantic."""

_DTFM_REFERENCE_SEQ_LEN = 2024
"""The DT-FM reference prices activations with 2024 tokens per sequence, a typo for 2048 that its published costs
carry (docs/dtfm.md, reference constants); `dtfm-reference` accounting keeps it so those costs reproduce."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelConfig:
    """A GPT-style decoder (byte-level by default) and the batch it trains on per optimizer step."""

    name: str
    n_layers: int
    d_model: int
    n_heads: int
    seq_len: int
    vocab_size: int = 256
    """Byte-level tokens need no tokenizer download."""
    batch_tokens: int
    """Tokens per optimizer step over all pipelines together."""
    micro_batches: int = 4
    """Micro-batches per pipeline per step (GPipe)."""
    grad_bytes_per_param: int = 4
    """fp32 gradients are all-reduced."""
    activation_bytes_per_value: int = 2
    """fp16/bf16 activations cross stage boundaries."""
    data_period: int | None = None
    """Steps after which the data order repeats: step s trains on the micro-batches of step s mod data_period, so
    that a sample recurs once per pass (activation deltas, protocol/wire_format.py, need it). None: every step draws
    fresh windows of the corpus."""
    nominal_params: int | None = None
    """Headline parameter count a paper quotes (1.3e9 for GPT-3 XL); only `dtfm-reference` accounting reads it."""
    payload_accounting: Literal["exact", "dtfm-reference"] = "exact"
    """`exact` counts this config's own parameters and activations. `dtfm-reference` prices payloads as the DT-FM
    reference does, to reproduce its published costs: c_DP spreads `nominal_params` evenly over the layers, and
    c_PP uses its 2024-token sequence typo and divides bytes by 2^30 while the cost model reads GB (decimal)."""

    def __post_init__(self) -> None:
        for field in ("n_layers", "d_model", "n_heads", "seq_len", "vocab_size", "batch_tokens", "micro_batches"):
            if getattr(self, field) < 1:
                raise ConfigError(f"{field} must be positive, got {getattr(self, field)} in model {self.name!r}")
        if self.d_model % self.n_heads:
            raise ConfigError(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads} in {self.name!r}")
        if self.data_period is not None and self.data_period < 1:
            raise ConfigError(f"data_period must be positive or None, got {self.data_period} in model {self.name!r}")
        if self.payload_accounting not in ("exact", "dtfm-reference"):
            raise ConfigError(f"payload_accounting must be 'exact' or 'dtfm-reference', got {self.payload_accounting!r}")
        if self.payload_accounting == "dtfm-reference" and not self.nominal_params:
            raise ConfigError(f"model {self.name!r}: dtfm-reference accounting needs nominal_params (e.g. 1.3e9)")

    @property
    def params_per_layer(self) -> int:
        """Attention 4d²+4d, MLP 8d²+5d, two LayerNorms 4d (GPT-2 block with biases)."""
        d = self.d_model
        return 12 * d * d + 13 * d

    @property
    def embedding_params(self) -> int:
        """Token and position embeddings, held by the first stage."""
        return (self.vocab_size + self.seq_len) * self.d_model

    @property
    def head_params(self) -> int:
        """Final LayerNorm and the (untied) output projection, held by the last stage."""
        return 2 * self.d_model + self.d_model * self.vocab_size

    @property
    def total_params(self) -> int:
        return self.embedding_params + self.n_layers * self.params_per_layer + self.head_params

    def stage_layers(self, d_pp: int) -> list[tuple[int, int]]:
        """Layer range [a, b) of every stage: as even as possible, earlier stages take the remainder."""
        if not 1 <= d_pp <= self.n_layers:
            raise ConfigError(f"cannot cut {self.n_layers} layers of {self.name!r} into {d_pp} stages")
        base, extra = divmod(self.n_layers, d_pp)
        bounds, start = [], 0
        for stage in range(d_pp):
            end = start + base + (1 if stage < extra else 0)
            bounds.append((start, end))
            start = end
        return bounds

    def stage_params(self, d_pp: int) -> list[int]:
        """Parameters held by each stage of the even cut (embedding on the first, head on the last)."""
        return [self.params_of(b - a, first=s == 0, last=s == d_pp - 1)
                for s, (a, b) in enumerate(self.stage_layers(d_pp))]

    def params_of(self, layers: int, *, first: bool, last: bool) -> int:
        """Parameters of a stage of `layers` layers, with the embedding if it is the first, the head if the last."""
        return layers * self.params_per_layer + self.embedding_params * first + self.head_params * last

    def flops_per_token_of(self, layers: int, *, first: bool, last: bool) -> float:
        """Forward+backward FLOPs per token of such a stage: 6·params plus attention 12·L·T·d (PaLM, Appendix B)."""
        return 6.0 * self.params_of(layers, first=first, last=last) + layers * 12 * self.seq_len * self.d_model

    def dp_payload_bytes_of(self, layers: int, *, first: bool, last: bool, bytes_per_value: float | None = None
                            ) -> float:
        """Gradient bytes such a stage's group all-reduces per step, at `bytes_per_value` (the wire's,
        protocol/wire_format.py) or else this config's `grad_bytes_per_param`."""
        width = self.grad_bytes_per_param if bytes_per_value is None else bytes_per_value
        if self.payload_accounting == "dtfm-reference":  # 1.3e9 · 4 B · 3/24 = 0.65 GB for GPT-3 XL on 8 stages
            return float(self.nominal_params * width * layers / self.n_layers)
        return float(self.params_of(layers, first=first, last=last) * width)

    def dp_payload_bytes(self, d_pp: int, bytes_per_value: float | None = None) -> float:
        """Gradient bytes one stage group all-reduces per step (the largest stage: c_DP), at `bytes_per_value`
        (the wire's, protocol/wire_format.py) or else this config's `grad_bytes_per_param`."""
        return max(self.dp_payload_bytes_of(b - a, first=s == 0, last=s == d_pp - 1, bytes_per_value=bytes_per_value)
                   for s, (a, b) in enumerate(self.stage_layers(d_pp)))

    def pp_payload_bytes(self, d_dp: int, bytes_per_value: float | None = None) -> float:
        """Activation bytes one pipeline sends across one stage boundary per step (c_PP), at `bytes_per_value` or
        else this config's `activation_bytes_per_value`."""
        width = self.activation_bytes_per_value if bytes_per_value is None else bytes_per_value
        tokens_per_pipeline = self.batch_tokens / d_dp
        if self.payload_accounting == "dtfm-reference":  # 125000/2048 seqs · 2024 · 2048 · 2 B / 2^30 = 0.4712 "GB"
            sequences = tokens_per_pipeline / self.seq_len
            gib = sequences * _DTFM_REFERENCE_SEQ_LEN * self.d_model * width / BYTES_PER_GIB
            return gib * BYTES_PER_GB
        return tokens_per_pipeline * self.d_model * width

    def data_step(self, step: int) -> int:
        """The step whose micro-batches step `step` trains on (itself unless the data order repeats)."""
        return step % self.data_period if self.data_period else step

    def stage_flops_per_token(self, d_pp: int) -> list[float]:
        """Forward+backward FLOPs per token of each stage of the even cut (`flops_per_token_of`)."""
        return [self.flops_per_token_of(b - a, first=s == 0, last=s == d_pp - 1)
                for s, (a, b) in enumerate(self.stage_layers(d_pp))]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ModelConfig":
        return cls(**data)


MODEL_PRESETS: dict[str, ModelConfig] = {
    config.name: config
    for config in (
        ModelConfig(name="tiny", n_layers=4, d_model=64, n_heads=4, seq_len=64, batch_tokens=8 * 64, micro_batches=2),
        ModelConfig(name="small", n_layers=8, d_model=256, n_heads=8, seq_len=256, batch_tokens=32 * 256),
        ModelConfig(name="gpt-1.3b", n_layers=24, d_model=2048, n_heads=16, seq_len=2048, batch_tokens=2**20),
        # GPT-3 XL as the DT-FM paper prices it (1e6 tokens per step); reproduces its c_DP and c_PP exactly.
        ModelConfig(
            name="paper-gpt3-xl", n_layers=24, d_model=2048, n_heads=16, seq_len=2048, vocab_size=50257,
            batch_tokens=1_000_000, nominal_params=1_300_000_000, payload_accounting="dtfm-reference",
        ),
    )
}


def get_model_config(name: str, **overrides: Any) -> ModelConfig:
    """A preset by name, optionally with some fields replaced (e.g. batch_tokens)."""
    try:
        config = MODEL_PRESETS[name]
    except KeyError:
        raise ConfigError(f"unknown model {name!r}; presets: {', '.join(sorted(MODEL_PRESETS))}") from None
    return replace(config, **overrides) if overrides else config


def load_model_config(name_or_path: str, **overrides: Any) -> ModelConfig:
    """A preset by name, or the config in a JSON file: ModelConfig fields, or a saved plan's `model` entry."""
    path = Path(name_or_path)
    if path.suffix != ".json":
        return get_model_config(name_or_path, **overrides)
    try:
        data = json.loads(path.read_text())
        data = data.get("model", data) if isinstance(data, dict) else data
        return replace(ModelConfig.from_dict(data), **overrides)
    except (OSError, json.JSONDecodeError, TypeError) as e:
        raise ConfigError(f"{path} does not hold a model config ({type(e).__name__}: {e})") from None
