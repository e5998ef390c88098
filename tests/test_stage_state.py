"""A stage's state as named tensors (client/training/stage_state.py): it carries training on exactly, whatever the
cut, and its byte form is deterministic and refuses what is not one."""
from __future__ import annotations

import random
from dataclasses import replace

import pytest
import torch

from hetswarm.client.training.model import build_full_model, build_stage
from hetswarm.client.training.stage_state import (
    StageState,
    decode_tensors,
    encode_tensors,
    unit_of,
    units_of_layers,
)
from hetswarm.client.training.stage_worker import StageConfig
from hetswarm.protocol.errors import RejectedInput
from hetswarm.protocol.model_config import get_model_config

TINY = get_model_config("tiny")
CONFIG = StageConfig(lr=3e-3)


def trained(module: torch.nn.Module, steps: int = 3, *, seed: int = 0) -> torch.optim.Optimizer:
    """A few AdamW steps on random gradients, so that the optimizer has state."""
    optimizer = CONFIG.build_optimizer(module.parameters())
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        for param in module.parameters():
            param.grad = torch.randn(param.shape, generator=generator)
        optimizer.step()
    return optimizer


def one_more_step(module: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    generator = torch.Generator().manual_seed(99)
    for param in module.parameters():
        param.grad = torch.randn(param.shape, generator=generator)
    optimizer.step()


def test_units_are_named_by_global_layer():
    assert units_of_layers((0, 2), 4) == ["embed", "blocks.0", "blocks.1"]
    assert units_of_layers((2, 4), 4) == ["blocks.2", "blocks.3", "head"]
    assert unit_of("blocks.3.mlp.fc.weight:exp_avg") == "blocks.3" and unit_of("head.out.weight") == "head"


def test_a_captured_state_carries_training_on_exactly():
    source = build_stage(TINY, 1, 2, seed=0)
    optimizer = trained(source)
    state = StageState.capture(source, optimizer, step=3)
    target = build_stage(TINY, 1, 2, seed=5)  # other weights, a fresh optimizer
    target_optimizer = CONFIG.build_optimizer(target.parameters())
    state.apply(target, target_optimizer)
    one_more_step(source, optimizer)
    one_more_step(target, target_optimizer)
    for (name, a), (_, b) in zip(source.named_parameters(), target.named_parameters()):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_a_state_re_cut_for_other_stages_fits_them(tied):
    model = replace(TINY, tie_embeddings=tied)
    whole = build_full_model(model, seed=0)
    state = StageState.capture(whole, trained(whole), step=3)
    first, last = build_stage(model, 0, 2, seed=1), build_stage(model, 1, 2, seed=1)
    halves = []
    for stage in (first, last):
        optimizer = CONFIG.build_optimizer(stage.parameters())
        state.select(units_of_layers(stage.layers, TINY.n_layers)).apply(stage, optimizer)
        for name, param in stage.named_parameters():
            assert torch.equal(param, dict(whole.named_parameters(remove_duplicate=False))[name]), name
            assert torch.equal(optimizer.state[param]["exp_avg"], state.tensors[f"{name}:exp_avg"]), name
        halves.append(StageState.capture(stage, optimizer, step=3))
    # a tied matrix travels under both its names: the last stage's copy is the whole model's one matrix
    assert torch.equal(last.head.out.weight, whole.embed.tok.weight) == tied
    merged = halves[0].merge(halves[1])
    assert merged.units == sorted(units_of_layers((0, TINY.n_layers), TINY.n_layers))
    assert sorted(merged.tensors) == sorted(state.tensors)
    back = build_full_model(model, seed=2)  # and a cut state makes the whole model again
    merged.apply(back, CONFIG.build_optimizer(back.parameters()))
    assert all(torch.equal(a, b) for a, b in zip(back.parameters(), whole.parameters()))


def test_a_partial_state_leaves_the_other_units_as_they_are():
    stage = build_stage(TINY, 0, 2, seed=0)
    before = {name: param.detach().clone() for name, param in stage.named_parameters()}
    donor = build_stage(TINY, 0, 2, seed=3)
    state = StageState.capture(donor, CONFIG.build_optimizer(donor.parameters()), step=1).select(["blocks.1"])
    state.apply(stage, CONFIG.build_optimizer(stage.parameters()))
    for name, param in stage.named_parameters():
        expected = dict(donor.named_parameters())[name] if unit_of(name) == "blocks.1" else before[name]
        assert torch.equal(param, expected), name


def test_a_state_that_does_not_fit_is_refused():
    stage = build_stage(TINY, 0, 2, seed=0)
    optimizer = CONFIG.build_optimizer(stage.parameters())
    state = StageState.capture(stage, optimizer, step=1)
    wrong_shape = StageState(1, state.tensors | {"embed.tok.weight": torch.zeros(3, 3)})
    with pytest.raises(RejectedInput, match="shape"):
        wrong_shape.apply(stage, optimizer)
    extra = StageState(1, state.tensors | {"blocks.0.mlp.fc.weight:bogus": torch.zeros(1), "blocks.9.x": torch.zeros(1)})
    with pytest.raises(RejectedInput, match="extra"):
        extra.apply(stage, optimizer)
    with pytest.raises(KeyError):
        state.select(["head"])


def test_the_encoding_round_trips_bit_for_bit_and_is_deterministic():
    tensors = {"a": torch.randn(3, 4), "b": torch.randn(5).to(torch.bfloat16), "c": torch.arange(7),
               "step": torch.tensor(3.0), "empty": torch.zeros(0, 2)}
    blob = encode_tensors(tensors)
    decoded = decode_tensors(blob)
    assert set(decoded) == set(tensors)
    for name, tensor in tensors.items():
        assert decoded[name].dtype == tensor.dtype and torch.equal(decoded[name], tensor), name
    replicas = [build_stage(TINY, 1, 2, seed=0) for _ in range(2)]
    states = [StageState.capture(replica, trained(replica), step=3) for replica in replicas]
    assert states[0].encode() == StageState(3, dict(reversed(states[0].tensors.items()))).encode()  # any order
    assert states[0].digest() == states[1].digest()  # two replicas trained alike: the same digest


def test_decoding_refuses_anything_that_is_not_an_encoding():
    blob = encode_tensors({"a": torch.randn(4, 4), "b": torch.arange(3), "s": torch.tensor(1.0)})
    with pytest.raises(RejectedInput):
        decode_tensors(blob[:-3])  # truncated
    with pytest.raises(RejectedInput):
        decode_tensors(b"\xff\xff\xff\xff" + blob)  # a header longer than any
    rng = random.Random(0)
    for _ in range(300):  # bounded fuzz: every mutation decodes or is refused, nothing else
        mutated = bytearray(blob)
        for _ in range(rng.randint(1, 4)):
            mutated[rng.randrange(len(mutated))] = rng.randrange(256)
        mutated = mutated[:rng.randint(0, len(mutated))] if rng.random() < 0.3 else mutated
        try:
            decode_tensors(bytes(mutated))
        except RejectedInput:
            pass
