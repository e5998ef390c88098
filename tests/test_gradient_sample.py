"""The sample of a sparse all-reduce (client/training/gradient_sample.py): drawn alike from the round tag and step,
of the share asked, and moved between the flat gradient and the values sent without losing or shifting a value."""
import math

import pytest
import torch

from hetswarm.client.training.gradient_sample import GradientSample, flatten, unflatten
from hetswarm.protocol.model_config import get_model_config
from hetswarm.protocol.wire_format import SAMPLE_BLOCK_VALUES, SPARSE_DENSITY, WireFormat, candidate_wires


def _sample(numel: int, step: int, density: float = 0.25, tag: str = "swarm/v3/stage1") -> GradientSample:
    return GradientSample(numel, density=density, round_tag=tag, step=step)


def test_every_member_draws_the_same_blocks_and_each_step_others():
    numel = 100 * SAMPLE_BLOCK_VALUES
    assert torch.equal(_sample(numel, 7).chosen, _sample(numel, 7).chosen)
    assert not torch.equal(_sample(numel, 7).chosen, _sample(numel, 8).chosen)
    assert not torch.equal(_sample(numel, 7).chosen, _sample(numel, 7, tag="swarm/v4/stage1").chosen)


@pytest.mark.parametrize("numel, density", [(1061, 0.25), (100 * SAMPLE_BLOCK_VALUES, 1 / 16), (10, 0.5), (5000, 1.0)])
def test_the_sample_has_the_share_asked_of_distinct_blocks_in_order(numel, density):
    sample = _sample(numel, 3, density)
    blocks = math.ceil(numel / SAMPLE_BLOCK_VALUES)
    assert len(sample.chosen) == max(1, math.ceil(density * blocks))
    assert sample.chosen.unique().tolist() == sample.chosen.tolist()  # distinct, increasing
    assert 0 <= int(sample.chosen.min()) and int(sample.chosen.max()) < blocks


@pytest.mark.parametrize("numel", [1061, 3 * SAMPLE_BLOCK_VALUES])
def test_gather_then_scatter_puts_every_sent_value_back_where_it_was(numel):
    sample = _sample(numel, 11, density=0.5)
    flat = torch.randn(numel, generator=torch.Generator().manual_seed(0))
    sent = sample.gather(flat)
    assert sent.numel() == sample.sent_values
    assert torch.equal(sample.scatter(sent, into=flat), flat)
    only_sent = sample.scatter(sent, into=torch.zeros(numel))
    kept = only_sent != 0
    assert torch.equal(only_sent[kept], flat[kept])
    assert int(kept.sum()) == sum(min(SAMPLE_BLOCK_VALUES, numel - SAMPLE_BLOCK_VALUES * int(b)) for b in sample.chosen)


def test_flatten_and_unflatten_are_inverse():
    tensors = [torch.randn(4, 3), torch.randn(5), torch.randn(2, 2, 2)]
    back = unflatten(flatten(tensors), tensors)
    assert all(torch.equal(a, b) and a.shape == b.shape for a, b in zip(back, tensors))


def test_the_sparse_policy_prices_only_the_sample_and_densities_are_checked():
    model = get_model_config("tiny")
    wire, = candidate_wires("sparse", model)
    assert wire.allreduce == "8bit" and wire.allreduce_density == SPARSE_DENSITY
    stage = {"layers": 2, "first": True, "last": False}
    assert math.isclose(wire.allreduce_payload_bytes(model, **stage),
                        WireFormat.uniform("8bit").allreduce_payload_bytes(model, **stage) * SPARSE_DENSITY)
    assert "of the gradient per step" in wire.describe()
    for density in (0.0, 1.0, 1.5):
        with pytest.raises(ValueError):
            WireFormat(activations="8bit", gradients="8bit", allreduce="8bit", allreduce_density=density)
