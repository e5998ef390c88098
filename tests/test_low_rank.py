"""The low-rank all-reduce's pure parts: the factors' rank, the orthonormal basis every member computes alike, and
the bytes the cost model prices for them (client/training/low_rank.py, protocol/wire_format.py). Rounds over real
daemons are in tests/test_group_allreduce.py, training in tests/test_compressed_training.py."""
import math

import numpy as np
import pytest
import torch

from hetswarm.client.training.low_rank import factor_rank, orthonormal
from hetswarm.client.training.model import build_stage
from hetswarm.coordinator.scheduling.cost_model import PaperCostModel, Payloads
from hetswarm.protocol.model_config import ModelConfig, get_model_config
from hetswarm.protocol.wire_format import BYTES_PER_VALUE, LOW_RANK_SHARE, WireFormat, candidate_wires
from tests.helpers.scheduler_oracles import random_network


@pytest.mark.parametrize(("shape", "share", "rank"), [
    ((64,), 0.25, 0), ((64, 64), 0.25, 8), ((256, 64), 0.25, 13), ((7, 3, 5), 0.25, 1), ((64, 64), 0.01, 1),
    ((2, 2), 0.25, 0), ((64, 64), 0.99, 0)])
def test_factors_hold_about_the_share_of_a_matrix_and_never_more_than_it(shape, share, rank):
    assert factor_rank(shape, share) == rank
    if rank:
        rows, columns = shape[0], math.prod(shape[1:])
        assert rank * (rows + columns) < rows * columns


def test_the_basis_is_orthonormal_spans_the_columns_and_keeps_a_zero_column_zero():
    p = torch.randn(40, 4, generator=torch.Generator().manual_seed(0))
    p[:, 2] = 0
    basis = orthonormal(p)
    kept = [0, 1, 3]
    torch.testing.assert_close(basis[:, kept].T @ basis[:, kept], torch.eye(3), rtol=0, atol=1e-6)
    assert not basis[:, 2].any() and basis.isfinite().all()
    projected = basis @ (basis.T @ p)
    torch.testing.assert_close(projected, p, rtol=0, atol=1e-5)
    assert torch.equal(orthonormal(p.clone()), basis)  # the same bits from the same average, on every member


LLAMA = ModelConfig(name="llama-gqa", architecture="llama", n_layers=4, d_model=64, n_heads=4, n_kv_heads=2, d_ff=176,
                    seq_len=64, vocab_size=300, tie_embeddings=True, batch_tokens=8 * 64)


@pytest.mark.parametrize("model", [get_model_config("tiny"), get_model_config("small"), LLAMA],
                         ids=["tiny", "small", "llama"])
def test_the_cost_model_prices_the_bytes_the_factors_take(model):
    """Each stage's all-reduce under `powersgd`, priced from the model's counts, against the values its parameters'
    factors (and whole vectors) take, within 8 %: ranks are rounded per matrix."""
    wire, = candidate_wires("powersgd", model)
    assert wire.allreduce_low_rank == LOW_RANK_SHARE and wire.allreduce_rounds == 2
    d_pp = 2
    for stage, (start, end) in enumerate(model.stage_layers(d_pp)):
        where = {"first": stage == 0, "last": stage == d_pp - 1}
        module = build_stage(model, stage, d_pp, seed=0)
        sent = 0
        for parameter in module.parameters():
            rank = factor_rank(parameter.shape, LOW_RANK_SHARE)
            sent += rank * (parameter.shape[0] + parameter[0].numel()) if rank else parameter.numel()
        priced = wire.allreduce_payload_bytes(model, end - start, **where) / BYTES_PER_VALUE["8bit"]
        assert priced == pytest.approx(sent, rel=0.08)
        whole = WireFormat.uniform("8bit").allreduce_payload_bytes(model, end - start, **where)
        assert whole / BYTES_PER_VALUE["8bit"] == sum(p.numel() for p in module.parameters())


def test_each_round_of_an_all_reduce_pays_the_links_latency():
    network = random_network(8, 0)
    cost = PaperCostModel(network, Payloads(dp_bytes=1e8, pp_bytes=1e7), d_dp=4, d_pp=2)
    groups = np.arange(8).reshape(2, 4)
    latency = [cost.concurrent_allreduce_s(groups, np.zeros(2), rounds=rounds) for rounds in (1, 2)]
    np.testing.assert_allclose(latency[1], 2 * latency[0])
    one, two = (cost.concurrent_allreduce_s(groups, np.array([1e8, 1e8]), rounds=rounds) for rounds in (1, 2))
    assert (two > one).all() and (two - one <= latency[0] + 1e-12).all()
    members = [cost.member_times_s(groups, rounds=rounds) for rounds in (1, 2)]
    np.testing.assert_allclose(members[1] - members[0], cost.member_times_s(groups, np.zeros(2)))


def test_a_wire_sends_a_sample_or_factors_not_both():
    for share in (0.0, 1.0, 1):
        with pytest.raises(ValueError, match="allreduce_low_rank"):
            WireFormat(activations="8bit", gradients="8bit", allreduce="8bit", allreduce_low_rank=share)
    with pytest.raises(ValueError, match="not both"):
        WireFormat(activations="8bit", gradients="8bit", allreduce="8bit", allreduce_density=0.1,
                   allreduce_low_rank=0.25)
    wire, = candidate_wires("powersgd", get_model_config("tiny"))
    assert WireFormat.from_dict(wire.to_dict()) == wire and "low-rank factors" in wire.describe()
