"""Model shapes the swarm can train (the byte and FLOP counts the cost model derives from them: model_counts.py).

Pure Python: the scheduler and the coordinator price a model without importing torch; the client's torch model
(hetswarm.client.training.model) is built from the same config.
"""
from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Literal

from hetswarm.protocol.errors import ConfigError
from hetswarm.protocol.limits import MAX_LAYERS
from hetswarm.protocol.model_counts import Architecture, ModelCounts, PayloadAccounting

_SHA256_HEX = re.compile(r"[0-9a-f]{64}")

PipelineSchedule = Literal["gpipe", "1f1b"]
"""The order of a stage's forward and backward passes in a step (client/training/pipeline_schedule.py); a plan
chooses it, the model does not, but the scheduler needs the name without the record schemas' pydantic."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelConfig(ModelCounts):
    """A decoder-only transformer (byte-level by default) and the batch it trains on per optimizer step.

    `architecture` picks the block: `gpt2` (nanoGPT's: LayerNorm, learned positions, GELU MLP of 4d, biases) or
    `llama` (RMSNorm, rotary positions, SwiGLU MLP of `d_ff`, grouped-query attention with `n_kv_heads`, no biases;
    transformers' LlamaDecoderLayer). `tie_embeddings` makes the output head's matrix the token embedding's.
    """

    name: str
    architecture: Architecture = "gpt2"
    n_layers: int
    d_model: int
    n_heads: int
    seq_len: int
    vocab_size: int = 256
    """Byte-level tokens need no tokenizer download."""
    n_kv_heads: int | None = None
    """Key and value heads of grouped-query attention (`llama`); None: one per query head."""
    d_ff: int | None = None
    """Width of the MLP's hidden layer (`llama`'s SwiGLU); None: 4·d_model. `gpt2` blocks are always 4·d_model."""
    tie_embeddings: bool = False
    """The output projection is the token embedding matrix (transformers' tie_word_embeddings). Split into
    stages, the first and the last stage each hold a copy and sum their gradients every step
    (client/training/stage_worker.py), so both count it."""
    rope_theta: float = 10_000.0
    """Base of the rotary position frequencies (`llama`)."""
    norm_eps: float = 1e-5
    """RMSNorm's epsilon (`llama`)."""
    init_digest: str | None = None
    """SHA-256 (hex) of the Hugging Face folder whose weights the model starts from (`hetswarm coordinator
    --init-from`; client/training/hf_folder.py); None: from the seed."""
    data_digest: str | None = None
    """SHA-256 (hex) of the data every peer must train on (`hetswarm coordinator --data`; client/training/data.py);
    None: whatever data each peer was given."""
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
    lr_warmup_steps: int = 0
    """Optimizer steps over which the learning rate rises linearly to the stages' lr (`lr_factor`); 0: none. Without
    it, AdamW's first steps at full lr made the `small` model's loss spike at step 6 and, with a low-rank all-reduce,
    stall near 2.9 for the next 100 steps; 10 steps of warm-up removed both (benchmarks/RESULTS.md `lr-warmup`)."""
    nominal_params: int | None = None
    """Headline parameter count a paper quotes (1.3e9 for GPT-3 XL); only `dtfm-reference` accounting reads it."""
    payload_accounting: PayloadAccounting = "exact"
    """`exact` counts this config's own parameters and activations. `dtfm-reference` prices payloads as the DT-FM
    reference does, to reproduce its published costs: c_DP spreads `nominal_params` evenly over the layers, and
    c_PP uses its 2024-token sequence typo and divides bytes by 2^30 while the cost model reads GB (decimal)."""

    def __post_init__(self) -> None:
        for field in ("n_layers", "d_model", "n_heads", "seq_len", "vocab_size", "batch_tokens", "micro_batches"):
            if getattr(self, field) < 1:
                raise ConfigError(f"{field} must be positive, got {getattr(self, field)} in model {self.name!r}")
        if self.n_layers > MAX_LAYERS:
            raise ConfigError(f"model {self.name!r} has {self.n_layers} layers, more than the {MAX_LAYERS} records "
                              "allow")
        if self.d_model % self.n_heads:
            raise ConfigError(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads} in {self.name!r}")
        if self.architecture not in ("gpt2", "llama"):
            raise ConfigError(f"architecture must be 'gpt2' or 'llama', got {self.architecture!r} in {self.name!r}")
        if self.architecture == "gpt2" and (self.n_kv_heads, self.d_ff) != (None, None):
            raise ConfigError(f"model {self.name!r}: n_kv_heads and d_ff are for the llama architecture")
        if self.kv_heads < 1 or self.n_heads % self.kv_heads or self.ff_width < 1:
            raise ConfigError(f"model {self.name!r}: need n_heads divisible by n_kv_heads and d_ff >= 1, got "
                              f"{self.n_heads}, {self.n_kv_heads} and {self.d_ff}")
        for field in ("init_digest", "data_digest"):
            if (digest := getattr(self, field)) is not None and not _SHA256_HEX.fullmatch(digest):
                raise ConfigError(f"model {self.name!r}: {field} must be 64 hex digits, got {digest!r}")
        if not (0 < self.norm_eps < 1 and 1 < self.rope_theta < 1e9):
            raise ConfigError(f"model {self.name!r}: need 0 < norm_eps < 1 and 1 < rope_theta < 1e9, got "
                              f"{self.norm_eps} and {self.rope_theta}")
        if not isinstance(self.tie_embeddings, bool):
            raise ConfigError(f"tie_embeddings must be true or false, got {self.tie_embeddings!r} in {self.name!r}")
        if self.lr_warmup_steps < 0:
            raise ConfigError(f"lr_warmup_steps must be >= 0, got {self.lr_warmup_steps} in model {self.name!r}")
        if self.data_period is not None and self.data_period < 1:
            raise ConfigError(f"data_period must be positive or None, got {self.data_period} in model {self.name!r}")
        if self.payload_accounting not in ("exact", "dtfm-reference"):
            raise ConfigError(f"payload_accounting must be 'exact' or 'dtfm-reference', got {self.payload_accounting!r}")
        if self.payload_accounting == "dtfm-reference" and not self.nominal_params:
            raise ConfigError(f"model {self.name!r}: dtfm-reference accounting needs nominal_params (e.g. 1.3e9)")

    def data_step(self, step: int) -> int:
        """The step whose micro-batches step `step` trains on (itself unless the data order repeats)."""
        return step % self.data_period if self.data_period else step

    def lr_factor(self, step: int) -> float:
        """The share of the full learning rate that optimizer step `step` (from 0) takes: (step + 1) / warm-up steps
        during the warm-up, then 1. A function of the step alone, so a replica that takes a stage over mid-warm-up
        needs nothing more than the step it starts from."""
        return min(1.0, (step + 1) / self.lr_warmup_steps) if self.lr_warmup_steps else 1.0

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
