"""The byte and FLOP counts the cost model derives from a model's shape (protocol/model_config.py, ModelConfig, holds
the shape and inherits these): parameters per stage, the activations a micro-batch keeps, the payloads of the
stage group's all-reduce (c_DP) and of a pipeline hop (c_PP). Pure Python, as the scheduler prices models without
torch.
"""
from __future__ import annotations

from typing import Literal

from hetswarm.protocol.errors import ConfigError
from hetswarm.protocol.units import BYTES_PER_GB, BYTES_PER_GIB

__all__ = ["Architecture", "ModelCounts", "PayloadAccounting"]

Architecture = Literal["gpt2", "llama"]
"""The transformer block a model is built of (ModelConfig.architecture)."""
PayloadAccounting = Literal["exact", "dtfm-reference"]
"""How payloads are counted (ModelConfig.payload_accounting)."""

_DTFM_REFERENCE_SEQ_LEN = 2024
"""The DT-FM reference prices activations with 2024 tokens per sequence, a typo for 2048 that its published costs
carry (docs/dtfm.md, reference constants); `dtfm-reference` accounting keeps it so those costs reproduce."""


class ModelCounts:
    """Counts of a ModelConfig's shape; the fields are ModelConfig's."""

    __slots__ = ()
    name: str
    architecture: Architecture
    n_layers: int
    d_model: int
    n_heads: int
    seq_len: int
    vocab_size: int
    n_kv_heads: int | None
    d_ff: int | None
    tie_embeddings: bool
    batch_tokens: int
    grad_bytes_per_param: int
    activation_bytes_per_value: int
    nominal_params: int | None
    payload_accounting: PayloadAccounting

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
        return (layers * self.params_per_layer + self.embedding_params * first + self.head_params * last
                - self._tied_copy(first, last))

    def matrix_params_of(self, layers: int, *, first: bool, last: bool) -> int:
        """The parameters of `params_of` that are matrices (a low-rank all-reduce factors them): the layers' matrix
        products, the embeddings (tokens, and `gpt2`'s positions) and the output projection."""
        return (layers * self.matrix_params_per_layer + self.embedding_params * first
                + self.d_model * self.vocab_size * last - self._tied_copy(first, last))

    def _tied_copy(self, first: bool, last: bool) -> int:
        """The tied matrix counted twice by a stage that is both the first and the last (held once)."""
        return self.d_model * self.vocab_size * (self.tie_embeddings and first and last)

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

    def stage_flops_per_token(self, d_pp: int) -> list[float]:
        """Forward+backward FLOPs per token of each stage of the even cut (`flops_per_token_of`)."""
        return [self.flops_per_token_of(b - a, first=s == 0, last=s == d_pp - 1)
                for s, (a, b) in enumerate(self.stage_layers(d_pp))]
