"""The parts of a Llama-style stage, built from transformers' own modules.

A block is transformers' ``LlamaDecoderLayer``, as Petals builds its servers' blocks (petals/models/llama/block.py),
so that the names inside it are the library's: our ``blocks.5.self_attn.q_proj.weight`` is the Hugging Face
checkpoint's ``model.layers.5.self_attn.q_proj.weight`` (``to_hf_name``). The embedding and the head are ours,
two modules each holding what their Hugging Face counterparts hold. transformers is imported here only, so a
GPT-2 swarm never pays for it.
"""
from __future__ import annotations

import re
from typing import Any

import torch
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRMSNorm, LlamaRotaryEmbedding

from hetswarm.protocol.errors import ConfigError
from hetswarm.protocol.model_config import ModelConfig

__all__ = ["LlamaDecoderLayer", "LlamaEmbedding", "LlamaHead", "LlamaRMSNorm", "Rotary", "hf_config",
           "is_transposed", "model_config", "to_hf_name"]

_HF_NAMES = {"embed.tok.weight": "model.embed_tokens.weight", "head.norm.weight": "model.norm.weight",
             "head.out.weight": "lm_head.weight"}
_BLOCK = re.compile(r"blocks\.(\d+)\.(.+)")


def hf_config(config: ModelConfig) -> LlamaConfig:
    """The transformers config of the same model: what its blocks are built from, and what an export writes."""
    return LlamaConfig(
        vocab_size=config.vocab_size, hidden_size=config.d_model, intermediate_size=config.ff_width,
        num_hidden_layers=config.n_layers, num_attention_heads=config.n_heads, num_key_value_heads=config.kv_heads,
        max_position_embeddings=config.seq_len, rms_norm_eps=config.norm_eps, rope_theta=config.rope_theta,
        hidden_act="silu", attention_bias=False, mlp_bias=False, tie_word_embeddings=config.tie_embeddings,
        attn_implementation="sdpa",  # causal without a mask: transformers/integrations/sdpa_attention.py
    )


def model_config(hf: dict[str, Any], *, name: str, seq_len: int | None, batch_tokens: int | None) -> ModelConfig:
    """Raises: KeyError (a field is missing), ConfigError (a Llama variant these blocks are not)."""
    if hf.get("attention_bias") or hf.get("mlp_bias"):
        raise ConfigError("a Llama with biases is not supported (hetswarm's Llama blocks have none)")
    rope = hf.get("rope_parameters") or {"rope_theta": hf.get("rope_theta", 10_000.0), "rope_type": "default"}
    if rope.get("rope_type", "default") != "default" or hf.get("hidden_act", "silu") != "silu":
        raise ConfigError(f"only default rotary embeddings and SiLU are supported, got {rope} and "
                          f"{hf.get('hidden_act')!r}")
    seq_len = seq_len or hf["max_position_embeddings"]
    return ModelConfig(
        name=name, architecture="llama", n_layers=hf["num_hidden_layers"], d_model=hf["hidden_size"],
        n_heads=hf["num_attention_heads"], n_kv_heads=hf.get("num_key_value_heads") or hf["num_attention_heads"],
        d_ff=hf["intermediate_size"], vocab_size=hf["vocab_size"], seq_len=seq_len,
        batch_tokens=batch_tokens or 8 * seq_len, rope_theta=float(rope["rope_theta"]),
        norm_eps=float(hf.get("rms_norm_eps", 1e-6)), tie_embeddings=bool(hf.get("tie_word_embeddings", False)))


def is_transposed(name: str) -> bool:
    """Llama checkpoints store every tensor as nn.Linear and nn.Embedding do."""
    return False


def to_hf_name(name: str) -> str:
    """Our parameter name (client/training/stage_state.py's global names) as a Hugging Face Llama checkpoint's."""
    if (block := _BLOCK.fullmatch(name)) is not None:
        return f"model.layers.{block[1]}.{block[2]}"
    return _HF_NAMES[name]


class LlamaEmbedding(nn.Module):
    """Token embeddings, held by the first stage: V·d parameters (positions are rotary, inside the blocks)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.tok = nn.Embedding(config.vocab_size, config.d_model)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.tok(tokens)  # (B, T, C)


class LlamaHead(nn.Module):
    """Final RMSNorm and the bias-free output projection (tied or not), held by the last stage: d + d·V parameters."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.norm = LlamaRMSNorm(config.d_model, eps=config.norm_eps)
        self.out = nn.Linear(config.d_model, config.vocab_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.norm(x))  # (B, T, V)


class Rotary(LlamaRotaryEmbedding):
    """transformers' rotary embedding, whose frequencies (a buffer, not a parameter) can be computed again after
    the stage was built on the meta device and materialised empty (model.build_stage)."""

    @torch.no_grad()
    def reset(self) -> None:
        inv_freq, _ = self.compute_default_rope_parameters(self.config)
        self.inv_freq.copy_(inv_freq)
        self.original_inv_freq.copy_(inv_freq)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin), each (1, T, head_dim), for the positions 0..T-1 of hidden states x (B, T, C)."""
        positions = torch.arange(x.shape[1], device=x.device)[None, :]  # (1, T)
        return super().forward(x, positions)
