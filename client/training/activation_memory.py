"""What a stage's forward pass keeps for its backward, measured: the check on the cost model's activation memory.

autograd hands every tensor it saves to `torch.autograd.graph.saved_tensors_hooks`; summing their distinct storages
gives the bytes one micro-batch holds until its backward pass, on any device, without the allocator's noise. Two
forwards of one and two sequences separate what grows with tokens (activations) from what does not (the bf16
copies of the weights that autocast makes once per forward, and Llama's rotary tables).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from hetswarm.client.training.model import StageModule, loss

__all__ = ["SavedBytes", "saved_bytes", "saved_for_backward"]


@dataclass(frozen=True, slots=True)
class SavedBytes:
    """Bytes a stage's forward keeps for its backward: `per_token` for each token of the micro-batch, and
    `per_micro_batch` whatever its size."""

    per_token: float
    per_micro_batch: float


def saved_bytes(module: StageModule, x: torch.Tensor, *, autocast: bool) -> int:
    """Bytes of the distinct storages autograd saves in ``module(x)``, less the module's parameters; `autocast` runs
    it as a CUDA stage runs, under bf16 autocast."""
    storages: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storages[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
        return tensor

    held = {p.untyped_storage().data_ptr() for p in module.parameters()}
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=autocast):
            out = module(x)
        if module.is_last:  # the loss, in fp32 as the stage takes it
            loss(out, torch.zeros(out.shape[:2], dtype=torch.long, device=out.device))
    return sum(size for pointer, size in storages.items() if pointer not in held)


def saved_for_backward(module: StageModule, *, autocast: bool) -> SavedBytes:
    """What a micro-batch of the stage keeps, from forwards of one and of two full sequences."""
    config = module.config
    device = next(module.parameters()).device

    def micro_batch(rows: int) -> torch.Tensor:
        if module.is_first:
            return torch.zeros(rows, config.seq_len, dtype=torch.long, device=device)
        return torch.randn(rows, config.seq_len, config.d_model, device=device, requires_grad=True)

    one, two = (saved_bytes(module, micro_batch(rows), autocast=autocast) for rows in (1, 2))
    per_token = (two - one) / config.seq_len
    return SavedBytes(per_token=per_token, per_micro_batch=one - per_token * config.seq_len)
