"""Model shapes the swarm can train, and the byte and FLOP counts the cost model derives from them.

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
from hetswarm.protocol.units import BYTES_PER_GB, BYTES_PER_GIB

_SHA256_HEX = re.compile(r"[0-9a-f]{64}")

Architecture = Literal["gpt2", "llama"]
"""The transformer block a model is built of (ModelConfig.architecture)."""

PipelineSchedule = Literal["gpipe", "1f1b"]
"""The order of a stage's forward and backward passes in a step (client/training/pipeline_schedule.py); a plan
chooses it, the model does not, but the scheduler needs the name without the record schemas' pydantic."""

_DTFM_REFERENCE_SEQ_LEN = 2024
"""The DT-FM reference prices activations with 2024 tokens per sequence, a typo for 2048 that its published costs
carry (docs/dtfm.md, reference constants); `dtfm-reference` accounting keeps it so those costs reproduce."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelConfig:
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
        if self.data_period is not None and self.data_period < 1:
            raise ConfigError(f"data_period must be positive or None, got {self.data_period} in model {self.name!r}")
        if self.payload_accounting not in ("exact", "dtfm-reference"):
            raise ConfigError(f"payload_accounting must be 'exact' or 'dtfm-reference', got {self.payload_accounting!r}")
        if self.payload_accounting == "dtfm-reference" and not self.nominal_params:
            raise ConfigError(f"model {self.name!r}: dtfm-reference accounting needs nominal_params (e.g. 1.3e9)")

    @property
    def kv_heads(self) -> int:
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    @property
    def ff_width(self) -> int:
        return 4 * self.d_model if self.d_ff is None else self.d_ff

    @property
    def params_per_layer(self) -> int:
        """`gpt2`: attention 4d²+4d, MLP 8d²+5d, two LayerNorms 4d. `llama`: queries and output 2d², keys and values
        2·d·kv (kv = d·n_kv_heads/n_heads), SwiGLU 3·d·d_ff, two RMSNorms 2d."""
        norms_and_biases = 2 * self.d_model if self.architecture == "llama" else 13 * self.d_model
        return self.matrix_params_per_layer + norms_and_biases

    @property
    def embedding_params(self) -> int:
        """Token embeddings, and (`gpt2`) learned position embeddings, held by the first stage."""
        positions = self.seq_len if self.architecture == "gpt2" else 0
        return (self.vocab_size + positions) * self.d_model

    @property
    def head_params(self) -> int:
        """Final norm (LayerNorm 2d, RMSNorm d) and the output projection (d·V: its own, or with
        `tie_embeddings` a copy of the embedding's), held by the last stage."""
        norm = 2 * self.d_model if self.architecture == "gpt2" else self.d_model
        return norm + self.d_model * self.vocab_size

    @property
    def matrix_params_per_layer(self) -> int:
        """The weights of a layer's matrix products (`params_per_layer` less biases and norms)."""
        d = self.d_model
        if self.architecture == "llama":
            return 2 * d * d + 2 * d * (d * self.kv_heads // self.n_heads) + 3 * d * self.ff_width
        return 12 * d * d

    @property
    def activation_bytes_per_token_per_layer(self) -> float:
        """Bytes one layer keeps for its backward pass per token, as autograd saves them on the CUDA path (bf16
        autocast over fp32 weights; client/training/activation_memory.py measures them, tests/test_model.py checks
        this count): the fp32 residual stream and norms, bf16 inputs of the matrix products, and of attention only
        what the fused kernel keeps (queries, keys, values, output, a log-sum-exp per head; no T×T scores).
        `gpt2`: 36·d + 4·n_heads + 16. `llama`: 30·d + 4·kv + 8·d_ff + 4·n_heads + 8, with
        kv = d·n_kv_heads/n_heads and the SwiGLU's gate, up, activation and product at 2 bytes. Korthikanti et al.
        2022 (Sect. 4.1) count 34·d + 5·n_heads·T for a block that stores its scores and dropout masks, which these
        blocks do not."""
        d = self.d_model
        if self.architecture == "llama":
            kv = d * self.kv_heads // self.n_heads
            return 30 * d + 4 * kv + 8 * self.ff_width + 4 * self.n_heads + 8
        return 36 * d + 4 * self.n_heads + 16

    @property
    def checkpoint_bytes_per_token_per_layer(self) -> float:
        """What a layer keeps per token when it recomputes its activations: its fp32 input."""
        return 4 * self.d_model

    def activation_bytes_per_token_of(self, layers: int, *, first: bool, last: bool) -> float:
        """Bytes per token a micro-batch keeps until its backward pass on a stage of `layers` layers: theirs, the
        token ids the embedding keeps (8 bytes), and on the last stage the final norm's, the head's bf16 input and
        the loss's fp32 log-probabilities (4·V; `gpt2` 4·V + 6·d + 16, `llama` 4·V + 10·d + 12)."""
        head = 4 * self.vocab_size + (6 * self.d_model + 16 if self.architecture == "gpt2" else 10 * self.d_model + 12)
        return layers * self.activation_bytes_per_token_per_layer + 8 * first + head * last

    def micro_batch_bytes_of(self, layers: int, *, first: bool, last: bool) -> float:
        """Bytes a micro-batch keeps until its backward pass whatever its size: the bf16 copy autocast makes of every
        weight matrix its forward multiplies by (one per forward pass), and its position tables (`gpt2`'s int64
        positions on the first stage, `llama`'s fp32 rotary cosines and sines where the stage runs layers), and
        on the last stage the loss's fp32 normaliser."""
        copies = 2 * (layers * self.matrix_params_per_layer + self.d_model * self.vocab_size * last) + 4 * last
        if self.architecture == "llama":
            return copies + 8 * self.seq_len * (self.d_model // self.n_heads) * (layers > 0)
        return copies + 8 * self.seq_len * first

    @property
    def total_params(self) -> int:
        return self.params_of(self.n_layers, first=True, last=True)

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
        """Parameters of a stage of `layers` layers, with the embedding if it is the first, the head if the last
        (a stage that is both holds a tied matrix once)."""
        shared = self.d_model * self.vocab_size * (self.tie_embeddings and first and last)
        return layers * self.params_per_layer + self.embedding_params * first + self.head_params * last - shared

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
