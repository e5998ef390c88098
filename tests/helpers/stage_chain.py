"""A pipeline's stages run in one process: what transformers and an exported folder must reproduce."""
from __future__ import annotations

import torch

from hetswarm.client.training.model import StageModule


def chain(stages: list[StageModule], tokens: torch.Tensor) -> torch.Tensor:
    """Logits (B, T, V) of tokens (B, T) through every stage in order."""
    x = tokens
    for stage in stages:
        x = stage(x)
    return x


@torch.no_grad()
def greedy(stages: list[StageModule], ids: list[int], new_tokens: int, end: int | None = None) -> list[int]:
    """Up to `new_tokens` likeliest next tokens after `ids`, one at a time, as transformers' greedy search takes
    them: it stops after the end-of-text token `end`."""
    new: list[int] = []
    while len(new) < new_tokens and (end is None or end not in new):
        new.append(int(chain(stages, torch.tensor([ids + new]))[0, -1].argmax()))
    return new
