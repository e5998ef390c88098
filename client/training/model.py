"""The decoder a hetswarm swarm trains, built one pipeline stage at a time.

nanoGPT's model (karpathy/nanoGPT, model.py) cut into stages: GPT-2 blocks with biases, pre-norm, an output head;
or, for ``architecture="llama"``, transformers' Llama blocks (client/training/llama.py). A stage holds only its
layer range [a, b) of the model; the first also holds the embeddings, the last the final norm and the head. Parameter
names are global (``blocks.5.attn.qkv.weight`` whatever the split), so a stage's state dict can be handed to a peer
whose stage covers other layers. With tied embeddings (ModelConfig.tie_embeddings) the whole model holds one matrix
under both names, ``embed.tok.weight`` and ``head.out.weight``, and a last stage without the embedding starts from a
copy of it (the stage worker keeps the copies equal).

Every module is initialised from its own generator, seeded by (seed, module): a stage's parameters do not depend
on which other stages exist, every replica of a stage starts identical, and any split of the model equals the
single-process model built with the same seed. Parameter counts match ``ModelConfig``'s formulas, which the
cost model prices (tests/test_model.py checks both).
"""
import math
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from hetswarm.protocol.model_config import ModelConfig

__all__ = ["EMBEDDING_MATRIX", "HEAD_MATRIX", "Block", "StageModule", "build_full_model", "build_stage", "loss"]

_INIT_STD = 0.02  # GPT-2's init (nanoGPT, GPT._init_weights)
EMBEDDING_MATRIX, HEAD_MATRIX = "embed.tok.weight", "head.out.weight"
"""The two names of the matrix that tied embeddings share."""


class CausalSelfAttention(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.n_heads = config.n_heads
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model)
        self.proj = nn.Linear(config.d_model, config.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)  # 3 × (B, T, C)
        q, k, v = (t.view(B, T, self.n_heads, C // self.n_heads).transpose(1, 2) for t in (q, k, v))  # (B, nh, T, hs)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # (B, T, C)
        return self.proj(y)


class MLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(config.d_model, 4 * config.d_model)
        self.proj = nn.Linear(4 * config.d_model, config.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x)))  # (B, T, 4C) inside, (B, T, C) out


class Block(nn.Module):
    """One pre-norm transformer layer: 12d² + 13d parameters (ModelConfig.params_per_layer)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.d_model)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.d_model)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))  # (B, T, C)


class Embedding(nn.Module):
    """Token and learned position embeddings, held by the first stage: (V + T_max)·d parameters."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.tok = nn.Embedding(config.vocab_size, config.d_model)
        self.pos = nn.Embedding(config.seq_len, config.d_model)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)  # (T,)
        return self.tok(tokens) + self.pos(positions)  # (B, T, C)


class Head(nn.Module):
    """Final LayerNorm and the bias-free output projection (tied or not), held by the last stage: 2d + d·V
    parameters."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.ln_f = nn.LayerNorm(config.d_model)
        self.out = nn.Linear(config.d_model, config.vocab_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.ln_f(x))  # (B, T, V)


class StageModule(nn.Module):
    """Layers [a, b) of the model: tokens (B, T) → hidden (B, T, d) on the first stage, hidden → hidden in the
    middle, hidden → logits (B, T, V) on the last; a single stage that is both first and last is the whole model.
    """

    def __init__(self, config: ModelConfig, layers: tuple[int, int], *, is_first: bool, is_last: bool,
                 recompute: bool = False) -> None:
        super().__init__()
        self.recompute = recompute
        """Keep only each block's input for the backward pass and run the block again there (the plan says so
        when the stage's activations would not fit: coordinator/scheduling/live_cost.py, Execution)."""
        a, b = layers
        if not 0 <= a < b <= config.n_layers:
            raise ValueError(f"layer range [{a}, {b}) is not a non-empty part of {config.n_layers} layers")
        self.config, self.layers = config, (a, b)
        if config.architecture == "llama":
            from hetswarm.client.training import llama  # transformers, imported only by the models that need it
            hf = llama.hf_config(config)
            embedding, block, head = llama.LlamaEmbedding, lambda i: llama.LlamaDecoderLayer(hf, i), llama.LlamaHead
            self.rotary, self._norms = llama.Rotary(hf), (llama.LlamaRMSNorm,)
        else:
            embedding, block, head = Embedding, lambda i: Block(config), Head
            self.rotary, self._norms = None, (nn.LayerNorm,)
        self.embed = embedding(config) if is_first else None
        self.blocks = nn.ModuleDict({str(i): block(i) for i in range(a, b)})  # keyed by global layer index
        self.head = head(config) if is_last else None
        self.tie()

    @property
    def is_first(self) -> bool:
        return self.embed is not None

    @property
    def is_last(self) -> bool:
        return self.head is not None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embed is not None:
            if x.dtype != torch.long or x.dim() != 2 or x.shape[1] > self.config.seq_len:
                raise ValueError(f"the first stage takes int64 tokens (B, T ≤ {self.config.seq_len}), "
                                 f"got {x.dtype} {tuple(x.shape)}")
            x = self.embed(x)  # (B, T, C)
        positions = {} if self.rotary is None else {"position_embeddings": self.rotary(x)}  # Llama's (cos, sin)
        for block in self.blocks.values():
            if self.recompute and torch.is_grad_enabled():
                x = checkpoint(block, x, use_reentrant=False, **positions)  # (B, T, C), rebuilt in the backward
            else:
                x = block(x, **positions)  # (B, T, C)
        return self.head(x) if self.head is not None else x  # (B, T, V) or (B, T, C)

    def tie(self) -> None:
        """With tied embeddings, makes the head's matrix the embedding's parameter when the stage holds both: once
        built, and again after a move to another device or dtype, which gives each module a new parameter."""
        if self.config.tie_embeddings and self.embed is not None and self.head is not None:
            self.head.out.weight = self.embed.tok.weight

    @torch.no_grad()
    def init_weights(self, seed: int) -> None:
        """GPT-2 init (nanoGPT): N(0, 0.02) weights, zero biases, unit norms, and for `gpt2` residual projections
        scaled by 1/√(2·n_layers) (Llama's init in transformers does not scale them); each module draws from its
        own generator so the result is independent of the split."""
        residual_std = _INIT_STD / math.sqrt(2 * self.config.n_layers)
        gpt2 = self.config.architecture == "gpt2"
        if self.rotary is not None:
            self.rotary.reset()
        parts = [(f"block {i}", block) for i, block in self.blocks.items()]
        parts += [(tag, part) for tag, part in (("embedding", self.embed), ("head", self.head)) if part is not None]
        for tag, part in parts:
            generator = torch.Generator().manual_seed(_module_seed(seed, tag))
            for name, module in part.named_modules():  # registration order: fixed by the classes above
                if tag == "head" and name == "out" and self.config.tie_embeddings:
                    continue  # the embedding's matrix (below)
                if isinstance(module, self._norms):
                    module.weight.fill_(1.0)
                    if getattr(module, "bias", None) is not None:
                        module.bias.zero_()
                elif isinstance(module, nn.Linear | nn.Embedding):
                    std = residual_std if gpt2 and name.endswith("proj") else _INIT_STD  # into the residual stream
                    module.weight.normal_(0.0, std, generator=generator)
                    if getattr(module, "bias", None) is not None:
                        module.bias.zero_()
        if self.config.tie_embeddings and self.head is not None and self.embed is None:  # a copy, as the first draws
            generator = torch.Generator().manual_seed(_module_seed(seed, "embedding"))
            self.head.out.weight.normal_(0.0, _INIT_STD, generator=generator)  # the embedding's first draw: its matrix


def _module_seed(seed: int, tag: str) -> int:
    """A 64-bit seed for one module, mixed from the run's seed and the module's name by numpy's SeedSequence."""
    entropy = [seed, *tag.encode()]
    return int(np.random.SeedSequence(entropy).generate_state(1, np.uint64)[0])


def loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean token cross-entropy, computed in fp32 so bf16 logits lose no precision in the softmax."""
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())  # (B·T, V) vs (B·T,)


def build_stage(
    config: ModelConfig,
    stage_index: int,
    d_pp: int,
    *,
    seed: int,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    stage_layers: Sequence[tuple[int, int]] | None = None,
    recompute: bool = False,
) -> StageModule:
    """Stage ``stage_index`` of ``d_pp``, with its layers of ``stage_layers`` (a plan's cut, checked where the plan
    was accepted) or, by default, of the even cut ModelConfig.stage_layers gives.

    The module is built on the meta device, materialised and initialised on the CPU in fp32 (CPU generators give
    the same numbers on every machine; CUDA ones do not), then moved to ``device`` and ``dtype``.
    """
    bounds = config.stage_layers(d_pp) if stage_layers is None else [tuple(r) for r in stage_layers]
    if not 0 <= stage_index < d_pp:
        raise ValueError(f"stage_index must be in [0, {d_pp}), got {stage_index}")
    with torch.device("meta"):
        stage = StageModule(config, bounds[stage_index], is_first=stage_index == 0, is_last=stage_index == d_pp - 1,
                            recompute=recompute)
    stage.to_empty(device="cpu")
    stage.tie()
    stage.init_weights(seed)
    stage = stage.to(device=device, dtype=dtype)
    stage.tie()
    return stage


def build_full_model(
    config: ModelConfig, *, seed: int, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32
) -> StageModule:
    """The whole model in one process (the d_pp = 1 stage): the reference every split must reproduce."""
    return build_stage(config, 0, 1, seed=seed, device=device, dtype=dtype)
