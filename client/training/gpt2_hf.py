"""hetswarm's GPT-2 stages as a Hugging Face ``GPT2LMHeadModel`` names and shapes them.

Our blocks are nanoGPT's, which are GPT-2's (karpathy/nanoGPT, model.py, ``GPT.from_pretrained``): the same
tensors under other names, except that GPT-2's ``Conv1D`` layers store their weights transposed (in × out) where
``nn.Linear`` stores out × in. The MLP's GELU is the exact one (``activation_function="gelu"``), not the tanh
approximation OpenAI's GPT-2 checkpoints use; their output head is tied to the token embedding (a folder says
whether: tie_word_embeddings, true unless given).
"""
from __future__ import annotations

import re
from typing import Any

from transformers import GPT2Config

from hetswarm.protocol.errors import ConfigError
from hetswarm.protocol.model_config import ModelConfig

__all__ = ["hf_config", "is_transposed", "model_config", "to_hf_name"]

_PARTS = {"embed.tok": "transformer.wte", "embed.pos": "transformer.wpe", "head.ln_f": "transformer.ln_f",
          "head.out": "lm_head"}
_BLOCK_PARTS = {"ln_1": "ln_1", "ln_2": "ln_2", "attn.qkv": "attn.c_attn", "attn.proj": "attn.c_proj",
                "mlp.fc": "mlp.c_fc", "mlp.proj": "mlp.c_proj"}
_BLOCK = re.compile(r"blocks\.(\d+)\.(.+)\.(weight|bias)")
_CONV1D = re.compile(r"blocks\.\d+\.(attn\.qkv|attn\.proj|mlp\.fc|mlp\.proj)\.weight")


def hf_config(config: ModelConfig) -> GPT2Config:
    return GPT2Config(
        vocab_size=config.vocab_size, n_positions=config.seq_len, n_embd=config.d_model, n_layer=config.n_layers,
        n_head=config.n_heads, activation_function="gelu", layer_norm_epsilon=1e-5,
        tie_word_embeddings=config.tie_embeddings, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        bos_token_id=None, eos_token_id=None,
    )


def model_config(hf: dict[str, Any], *, name: str, seq_len: int | None, batch_tokens: int | None) -> ModelConfig:
    """Raises: KeyError (a field is missing), ConfigError (a GPT-2 that is not hetswarm's block)."""
    if hf.get("activation_function", "gelu_new") != "gelu" or hf.get("n_inner") is not None:
        raise ConfigError(f"GPT-2 with activation {hf.get('activation_function', 'gelu_new')!r} and n_inner "
                          f"{hf.get('n_inner')}: hetswarm's GPT-2 block has the exact GELU and a 4·d MLP")
    seq_len = seq_len or hf["n_positions"]
    return ModelConfig(name=name, n_layers=hf["n_layer"], d_model=hf["n_embd"], n_heads=hf["n_head"],
                       vocab_size=hf["vocab_size"], seq_len=seq_len, batch_tokens=batch_tokens or 8 * seq_len,
                       tie_embeddings=bool(hf.get("tie_word_embeddings", True)))  # GPT-2's own are tied


def to_hf_name(name: str) -> str:
    """Our parameter name (client/training/stage_state.py's global names) as a GPT2LMHeadModel checkpoint's."""
    if (block := _BLOCK.fullmatch(name)) is not None:
        return f"transformer.h.{block[1]}.{_BLOCK_PARTS[block[2]]}.{block[3]}"
    part, _, kind = name.rpartition(".")
    return f"{_PARTS[part]}.{kind}"


def is_transposed(name: str) -> bool:
    """Whether the checkpoint stores this tensor of ours transposed (a Conv1D weight)."""
    return _CONV1D.fullmatch(name) is not None
