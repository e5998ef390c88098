"""The torch model: parameter counts and activation bytes the cost model prices, and a deterministic init that any
stage split shares."""
from dataclasses import replace

import pytest
import torch

from hetswarm.client.training.activation_memory import saved_for_backward
from hetswarm.client.training.model import StageModule, build_full_model, build_stage, loss
from hetswarm.client.training.stage_worker import StageConfig
from hetswarm.protocol.errors import ConfigError
from hetswarm.protocol.model_config import ModelConfig, get_model_config

TINY = get_model_config("tiny")


def _meta_stages(config, d_pp):
    """Stages without memory or init: enough to count parameters of any model size."""
    with torch.device("meta"):
        return [StageModule(config, layers, is_first=s == 0, is_last=s == d_pp - 1)
                for s, layers in enumerate(config.stage_layers(d_pp))]


@pytest.mark.parametrize("name, d_pp", [("tiny", 1), ("tiny", 3), ("small", 1), ("small", 4), ("gpt-1.3b", 8)])
def test_parameter_counts_match_the_cost_model(name, d_pp):
    config = get_model_config(name)
    counts = [sum(p.numel() for p in stage.parameters()) for stage in _meta_stages(config, d_pp)]
    assert counts == config.stage_params(d_pp)
    assert sum(counts) == config.total_params



ACTIVATION_MODELS = [
    ModelConfig(name="gpt2-wide", n_layers=6, d_model=64, n_heads=4, seq_len=32, vocab_size=100, batch_tokens=64),
    ModelConfig(name="gpt2-long", n_layers=6, d_model=32, n_heads=2, seq_len=64, vocab_size=300, batch_tokens=128),
    ModelConfig(name="llama-gqa", architecture="llama", n_layers=6, d_model=64, n_heads=4, n_kv_heads=2, d_ff=176,
                seq_len=32, vocab_size=100, batch_tokens=64),
    ModelConfig(name="llama-mha", architecture="llama", n_layers=6, d_model=32, n_heads=2, d_ff=96, seq_len=64,
                vocab_size=300, batch_tokens=128),
]


@pytest.mark.parametrize("config", ACTIVATION_MODELS, ids=lambda config: config.name)
@pytest.mark.parametrize("stage", [0, 1, 2])
@pytest.mark.parametrize("recompute", [False, True], ids=["stored", "recomputed"])
def test_activation_bytes_are_what_autograd_saves_under_bf16_autocast(config, stage, recompute):
    """The cost model's memory per micro-batch in flight (coordinator/scheduling/live_cost.py) is what a stage's forward keeps,
    byte for byte, as the CUDA path runs it; recomputing layers keep only their fp32 inputs."""
    module = build_stage(config, stage, 3, seed=0, recompute=recompute)
    layers, where = 2, {"first": stage == 0, "last": stage == 2}
    saved = saved_for_backward(module, autocast=True)
    if recompute:
        assert saved.per_token == (layers * config.checkpoint_bytes_per_token_per_layer
                                   + config.activation_bytes_per_token_of(0, **where))
        assert saved.per_micro_batch == config.micro_batch_bytes_of(0, **where)
    else:
        assert saved.per_token == config.activation_bytes_per_token_of(layers, **where)
        assert saved.per_micro_batch == config.micro_batch_bytes_of(layers, **where)


@pytest.mark.parametrize("config", [replace(model, tie_embeddings=True) for model in (TINY, ACTIVATION_MODELS[2])],
                         ids=["gpt2", "llama"])
def test_tied_embeddings_are_one_matrix_whole_and_equal_copies_when_cut(config):
    """The whole model (on any device or dtype) holds the matrix once under both names; cut into stages, the last
    stage's head starts as a copy of the first stage's embedding; the counts are the cost model's."""
    for dtype in (torch.float32, torch.float64):
        whole = build_full_model(config, seed=3, dtype=dtype)
        assert whole.head.out.weight is whole.embed.tok.weight
        assert sum(p.numel() for p in whole.parameters()) == config.total_params
    untied = replace(config, tie_embeddings=False)
    assert config.total_params == untied.total_params - config.d_model * config.vocab_size
    stages = [build_stage(config, s, 3, seed=3) for s in range(3)]
    assert torch.equal(stages[2].head.out.weight, stages[0].embed.tok.weight)
    assert torch.equal(stages[0].embed.tok.weight, build_full_model(config, seed=3).embed.tok.weight)
    assert [sum(p.numel() for p in stage.parameters()) for stage in stages] == config.stage_params(3)


def test_same_seed_gives_identical_replicas_and_another_seed_does_not():
    first, second = build_stage(TINY, 1, 2, seed=7), build_stage(TINY, 1, 2, seed=7)
    other = build_stage(TINY, 1, 2, seed=8)
    for (name, a), b, c in zip(first.state_dict().items(), second.state_dict().values(), other.state_dict().values()):
        assert torch.equal(a, b), name
        if name.endswith("weight") and "ln_" not in name:  # LayerNorms and biases start equal on purpose
            assert not torch.equal(a, c), name


@pytest.mark.parametrize("d_pp", [2, 3, 4])
def test_every_split_holds_the_parameters_of_the_full_model(d_pp):
    full = build_full_model(TINY, seed=3).state_dict()
    names = []
    for s in range(d_pp):
        for name, tensor in build_stage(TINY, s, d_pp, seed=3).state_dict().items():
            assert torch.equal(tensor, full[name]), name
            names.append(name)
    assert sorted(names) == sorted(full)


def test_chained_stages_compute_the_full_model():
    tokens = torch.randint(0, TINY.vocab_size, (2, TINY.seq_len), generator=torch.Generator().manual_seed(0))
    x = tokens
    for s in range(2):
        x = build_stage(TINY, s, 2, seed=5)(x)
    assert x.shape == (2, TINY.seq_len, TINY.vocab_size)
    torch.testing.assert_close(x, build_full_model(TINY, seed=5)(tokens), rtol=0, atol=1e-6)


@pytest.mark.parametrize("cut", [((0, 1), (1, 4)), ((0, 3), (3, 4)), ((0, 1), (1, 2), (2, 4))])
def test_an_uneven_cut_with_recomputation_gives_the_full_model_s_loss_and_gradients(cut):
    """A plan may give a stage fewer layers and make it recompute its activations (coordinator/scheduling/live_cost.py,
    Execution): the chain of such stages computes what the full model does, gradients included."""
    tokens = torch.randint(0, TINY.vocab_size, (2, TINY.seq_len), generator=torch.Generator().manual_seed(0))
    targets = torch.roll(tokens, -1, dims=1)
    full = build_full_model(TINY, seed=5)
    loss(full(tokens), targets).backward()
    stages = [build_stage(TINY, s, len(cut), seed=5, stage_layers=cut, recompute=True) for s in range(len(cut))]
    x = tokens
    for stage in stages:
        x = stage(x)
    loss(x, targets).backward()
    reference = dict(full.named_parameters())
    for stage in stages:
        assert stage.recompute
        for name, param in stage.named_parameters():
            torch.testing.assert_close(param.grad, reference[name].grad, rtol=0, atol=1e-6, msg=name)


def test_recomputation_rebuilds_activations_in_the_backward_pass_only():
    stage = build_stage(TINY, 0, 2, seed=5, recompute=True)
    calls, mlp = [], stage.blocks["0"].mlp
    forward = mlp.forward
    mlp.forward = lambda x: calls.append(1) or forward(x)  # (torch runs no module hooks while it recomputes)
    tokens = torch.randint(0, TINY.vocab_size, (2, 8), generator=torch.Generator().manual_seed(0))
    stage(tokens).sum().backward()
    assert len(calls) == 2  # the forward pass, then again in the backward pass
    with torch.no_grad():
        stage(tokens)
    assert len(calls) == 3  # no gradients, nothing to recompute: once


def test_attention_is_causal():
    model = build_full_model(TINY, seed=1)
    tokens = torch.randint(0, 256, (1, 16), generator=torch.Generator().manual_seed(0))
    changed = tokens.clone()
    changed[0, 10] = (tokens[0, 10] + 1) % 256
    before, after = model(tokens), model(changed)
    torch.testing.assert_close(before[:, :10], after[:, :10])
    assert not torch.allclose(before[:, 10:], after[:, 10:])


def test_first_stage_refuses_hidden_states_and_overlong_sequences():
    first = build_stage(TINY, 0, 2, seed=0)
    with pytest.raises(ValueError, match="int64 tokens"):
        first(torch.zeros(1, 4, TINY.d_model))
    with pytest.raises(ValueError, match="int64 tokens"):
        first(torch.zeros(1, TINY.seq_len + 1, dtype=torch.long))


def test_stage_is_built_in_the_requested_dtype_from_the_same_numbers():
    fp32, bf16 = build_stage(TINY, 1, 2, seed=2), build_stage(TINY, 1, 2, seed=2, dtype=torch.bfloat16)
    for a, b in zip(fp32.parameters(), bf16.parameters()):
        assert b.dtype == torch.bfloat16
        assert torch.equal(a.to(torch.bfloat16), b)


def test_bad_stage_index_is_refused():
    with pytest.raises(ValueError, match="stage_index"):
        build_stage(TINY, 2, 2, seed=0)


def test_the_learning_rate_warms_up_linearly_from_the_step_number_and_negative_warm_ups_are_refused():
    config, model = StageConfig(lr=1e-3), get_model_config("tiny", lr_warmup_steps=4)
    optimizer = config.build_optimizer(build_full_model(model, seed=0).parameters())
    rates = []
    for step in (0, 1, 3, 4, 100, 2):  # a replica that takes over at step 2 needs nothing but the step
        config.set_step_lr(optimizer, model, step)
        rates.append(optimizer.param_groups[0]["lr"])
    assert rates == pytest.approx([2.5e-4, 5e-4, 1e-3, 1e-3, 1e-3, 7.5e-4])
    assert get_model_config("tiny").lr_factor(0) == 1.0  # no warm-up: the full rate from the first step
    with pytest.raises(ConfigError, match="lr_warmup_steps"):
        get_model_config("tiny", lr_warmup_steps=-1)
