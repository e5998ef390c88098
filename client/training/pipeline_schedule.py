"""The order in which a stage runs its micro-batches' forward and backward passes in one step.

GPipe (Huang et al. 2019, Sect. 2.2) runs every forward, then every backward in reverse: each stage holds all M
micro-batches' activations at the turn. 1F1B (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training
on GPU Clusters Using Megatron-LM", Sect. 2.2.1, the non-interleaved schedule; Megatron-LM's
`forward_backward_pipelining_without_interleaving`) runs D_PP − s − 1 warm-up forwards on stage s, then alternates
one forward and one backward, then drains the remaining backwards: stage s never holds more than min(D_PP − s, M)
micro-batches, and the step's fill and drain are GPipe's. Both send every frame as soon as it is computed and take
frames by (step, attempt, micro-batch), so neither can deadlock (tests/test_pipeline_schedule.py plays every stage).
"""
from __future__ import annotations

from typing import Literal

from hetswarm.protocol.model_config import PipelineSchedule

__all__ = ["Pass", "pass_order"]

Pass = tuple[Literal["forward", "backward"], int]
"""A pass of one micro-batch."""


def pass_order(schedule: PipelineSchedule, *, stage: int, d_pp: int, micro_batches: int) -> list[Pass]:
    """Stage `stage`'s passes of one step, in the order it runs them."""
    forwards = [("forward", m) for m in range(micro_batches)]
    if schedule == "gpipe":
        return forwards + [("backward", m) for m in reversed(range(micro_batches))]
    warmup = min(d_pp - stage - 1, micro_batches)
    order: list[Pass] = forwards[:warmup]
    for m in range(micro_batches - warmup):
        order += [("forward", warmup + m), ("backward", m)]
    return order + [("backward", m) for m in range(micro_batches - warmup, micro_batches)]
