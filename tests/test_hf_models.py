"""Hugging Face models in and out: any cut of hetswarm's stages computes what transformers' LlamaForCausalLM and
GPT2LMHeadModel compute, a folder saved by transformers loads stage by stage, and an export loads in transformers.

Each model is a tiny random one the test saves itself (nothing is downloaded), with its norms moved off 1 so
that a norm read into the wrong place would show.
"""
import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM
from typer.testing import CliRunner

from hetswarm.client.cli.app import app
from hetswarm.client.cli.coordinator import load_model, starting_from
from hetswarm.client.training import gpt2_hf, llama
from hetswarm.client.training.checkpoints import CheckpointDir
from hetswarm.client.training.hf_folder import (
    export_folder,
    load_initial_weights,
    load_stage_tensors,
    model_config_of,
    sample,
    weights_digest,
)
from hetswarm.client.training.model import EMBEDDING_MATRIX, HEAD_MATRIX, StageModule, build_stage, loss
from hetswarm.client.training.stage_state import StageState
from hetswarm.protocol.errors import ConfigError
from hetswarm.protocol.model_config import ModelConfig
from tests.helpers.golden_runs import LR3_CONFIG, TINY_RUN
from tests.helpers.stage_chain import chain, greedy
from tests.helpers.tiny_training import D_DP, D_PP, SEED, assert_first_step_is_the_reference, train_swarm


def _llama(tied: bool) -> LlamaForCausalLM:
    return LlamaForCausalLM(LlamaConfig(
        vocab_size=97, hidden_size=32, intermediate_size=72, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=16, rope_theta=5000.0, rms_norm_eps=1e-6,
        tie_word_embeddings=tied))


def _gpt2(tied: bool) -> GPT2LMHeadModel:
    return GPT2LMHeadModel(GPT2Config(vocab_size=97, n_positions=16, n_embd=32, n_layer=4, n_head=4,
                                      activation_function="gelu", tie_word_embeddings=tied, bos_token_id=None,
                                      eos_token_id=None))


MODELS = {"llama": (_llama, False), "llama-tied": (_llama, True), "gpt2": (_gpt2, False), "gpt2-tied": (_gpt2, True)}
"""Each with its own output head, and with the head tied to the token embedding (one matrix, saved once)."""
LAYOUTS = {"llama": llama, "gpt2": gpt2_hf}
CUTS = {"2 stages": [(0, 2), (2, 4)], "3 stages": [(0, 1), (1, 3), (3, 4)]}
TINY_LLAMA = ModelConfig(name="tiny-llama", architecture="llama", n_layers=4, d_model=32, n_heads=4, n_kv_heads=2,
                         d_ff=72, vocab_size=97, seq_len=16, batch_tokens=64)
MLP_WEIGHT = {"llama": "model.layers.2.mlp.up_proj.weight", "gpt2": "transformer.h.2.mlp.c_fc.weight"}


@pytest.fixture(scope="module", params=MODELS)
def saved(request, tmp_path_factory) -> tuple[torch.nn.Module, Path]:
    torch.manual_seed(0)
    make, tied = MODELS[request.param]
    model = make(tied).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" in name or "ln_" in name:
                parameter.add_(0.1 * torch.randn_like(parameter))
    folder = tmp_path_factory.mktemp(request.param) / f"tiny-{request.param}"
    model.save_pretrained(folder)
    return model, folder


def _tokens(config: ModelConfig) -> torch.Tensor:
    return torch.randint(0, config.vocab_size, (2, config.seq_len), generator=torch.Generator().manual_seed(1))


def _stages(config: ModelConfig, cut: list[tuple[int, int]], *, seed: int = 0, recompute: bool = False
            ) -> list[StageModule]:
    return [build_stage(config, s, len(cut), seed=seed, stage_layers=cut, recompute=recompute)
            for s in range(len(cut))]


def test_the_config_is_read_from_the_folder_and_counts_what_transformers_builds(saved):
    model, folder = saved
    config = model_config_of(folder)
    assert (config.n_layers, config.d_model, config.n_heads, config.vocab_size, config.seq_len) == (4, 32, 4, 97, 16)
    assert config.total_params == model.num_parameters()
    for cut in CUTS.values():
        with torch.device("meta"):
            stages = [StageModule(config, layers, is_first=s == 0, is_last=s == len(cut) - 1)
                      for s, layers in enumerate(cut)]
        counts = [sum(p.numel() for p in stage.parameters()) for stage in stages]
        assert counts == [config.params_of(b - a, first=s == 0, last=s == len(cut) - 1)
                          for s, (a, b) in enumerate(cut)]


def test_our_names_map_one_to_one_onto_the_checkpoint_s(saved):
    model, folder = saved
    config = model_config_of(folder)
    ours = _chain_names(config)
    assert sorted(LAYOUTS[config.architecture].to_hf_name(name) for name in ours) == sorted(model.state_dict())


def _chain_names(config: ModelConfig) -> list[str]:
    with torch.device("meta"):
        return list(StageModule(config, (0, config.n_layers), is_first=True, is_last=True).state_dict())


@pytest.mark.parametrize("recompute", [False, True], ids=["stored", "recomputed"])
@pytest.mark.parametrize("cut", CUTS.values(), ids=CUTS.keys())
def test_stages_loaded_from_the_folder_give_transformers_logits_loss_and_gradients(saved, cut, recompute):
    model, folder = saved
    config = model_config_of(folder)
    layout = LAYOUTS[config.architecture]
    stages = _stages(config, cut, seed=123, recompute=recompute)  # other weights first: the load must replace all
    for stage in stages:
        load_stage_tensors(folder, stage)
    tokens = _tokens(config)
    logits = chain(stages, tokens)
    ours = loss(logits[:, :-1], tokens[:, 1:])
    ours.backward()
    model.zero_grad()
    expected = model(input_ids=tokens, labels=tokens)  # transformers shifts the labels itself
    expected.loss.backward()
    torch.testing.assert_close(logits, expected.logits, rtol=0, atol=1e-5)
    torch.testing.assert_close(ours, expected.loss, rtol=0, atol=1e-5)
    hf_parameters = dict(model.named_parameters(remove_duplicate=False))
    grads = {name: parameter.grad for stage in stages for name, parameter in stage.named_parameters()}
    if config.tie_embeddings:  # the first and last stages' copies: the swarm sums them (tied_embeddings.py)
        grads[EMBEDDING_MATRIX] = grads[HEAD_MATRIX] = grads[EMBEDDING_MATRIX] + grads[HEAD_MATRIX]
    for name, grad in grads.items():
        expected_grad = hf_parameters[layout.to_hf_name(name)].grad
        torch.testing.assert_close(grad, expected_grad.t() if layout.is_transposed(name) else expected_grad,
                                   rtol=0, atol=1e-5, msg=name)


def test_an_export_of_every_stage_loads_in_transformers_and_gives_the_same_logits(saved, tmp_path):
    config = model_config_of(saved[1])
    stages = _stages(config, CUTS["3 stages"], seed=5)  # hetswarm's own init, not the folder's weights
    tensors = {name: tensor for stage in stages for name, tensor in stage.state_dict().items()}
    out = export_folder(config, tensors, tmp_path / "export")
    exported = AutoModelForCausalLM.from_pretrained(out).eval()
    tokens = _tokens(config)
    with torch.no_grad():
        torch.testing.assert_close(exported(input_ids=tokens).logits, chain(stages, tokens), rtol=0, atol=1e-5)
    if not config.tie_embeddings:  # a random tied model repeats its last token: its text would show nothing
        prompt = "!#%&("  # bytes below the tiny vocabulary: a byte-level model's text
        expected = bytes(greedy(stages, list(prompt.encode()), 8)).decode()
        assert len(set(expected)) > 2 and sample(out, prompt, max_new_tokens=8, temperature=0) == expected
    with pytest.raises(ConfigError, match="exists"):
        export_folder(config, tensors, out)
    with pytest.raises(ConfigError, match="tensors missing"):
        export_folder(config, stages[0].state_dict(), tmp_path / "first-stage-only")
    assert not (tmp_path / "first-stage-only").exists()


def test_a_model_over_the_shard_size_is_exported_in_shards_that_transformers_and_join_load(saved, tmp_path):
    config = model_config_of(saved[1])
    stages = _stages(config, CUTS["3 stages"], seed=5)
    tensors = {name: tensor for stage in stages for name, tensor in stage.state_dict().items()}
    total = sum(tensor.numel() * tensor.element_size() for tensor in tensors.values())
    out = export_folder(config, tensors, tmp_path / "sharded", max_shard_bytes=total // 3)
    assert not (out / "model.safetensors").exists() and len(list(out.glob("model-*-of-*.safetensors"))) >= 3
    tokens = _tokens(config)
    with torch.no_grad():
        logits = AutoModelForCausalLM.from_pretrained(out).eval()(input_ids=tokens).logits
        torch.testing.assert_close(logits, chain(stages, tokens), rtol=0, atol=1e-5)
    assert weights_digest(out) != weights_digest(saved[1])
    reloaded = _stages(config, CUTS["3 stages"], seed=6)  # what `join --model-dir` does with each stage
    for stage in reloaded:
        load_stage_tensors(out, stage)
    with torch.no_grad():
        torch.testing.assert_close(chain(reloaded, tokens), chain(stages, tokens), rtol=0, atol=0)


def test_the_coordinator_takes_the_folder_or_its_config_json_as_model(saved, tmp_path):
    _, folder = saved
    assert load_model(str(folder)) == model_config_of(folder)
    assert load_model(str(folder / "config.json"), micro_batches=3) == replace(model_config_of(folder), micro_batches=3)
    fields = tmp_path / "fields.json"  # a JSON file of ModelConfig fields is still read as before
    fields.write_text(json.dumps(model_config_of(folder).to_dict()))
    assert load_model(str(fields)) == model_config_of(folder)


def test_a_missing_tensor_or_a_wrong_shape_is_a_one_line_error_naming_it(saved, tmp_path):
    _, folder = saved
    config = model_config_of(folder)
    lost = MLP_WEIGHT[config.architecture]
    missing = tmp_path / "missing"
    missing.mkdir()
    save_file({name: t for name, t in load_file(folder / "model.safetensors").items() if name != lost},
              missing / "model.safetensors")
    with pytest.raises(ConfigError, match=f"no tensor '{lost}'") as error:
        load_stage_tensors(missing, build_stage(config, 1, 2, seed=0))
    assert "\n" not in str(error.value)
    load_stage_tensors(missing, build_stage(config, 0, 2, seed=0))  # the first stage does not need layer 2
    wider = ModelConfig(**{**config.to_dict(), "d_model": 64, "n_kv_heads": None})
    with pytest.raises(ConfigError, match=r"has shape \(\d+, 32\), the model's config wants \(\d+, 64\)") as error:
        load_stage_tensors(folder, build_stage(wider, 0, 2, seed=0))
    assert "\n" not in str(error.value)


def test_a_config_hetswarm_cannot_build_is_refused_naming_the_file(tmp_path):
    GPT2Config(n_layer=2, n_embd=16, n_head=2).save_pretrained(tmp_path / "openai-gpt2")  # tanh GELU, tied head
    with pytest.raises(ConfigError, match=r"openai-gpt2/config.json: GPT-2 with activation 'gelu_new'"):
        model_config_of(tmp_path / "openai-gpt2")
    (tmp_path / "bert").mkdir()
    (tmp_path / "bert" / "config.json").write_text('{"model_type": "bert"}')
    with pytest.raises(ConfigError, match="reads model_type 'llama' and 'gpt2', not 'bert'"):
        model_config_of(tmp_path / "bert")


def test_llama_only_fields_are_refused_on_gpt2_and_heads_must_group():
    with pytest.raises(ConfigError, match="llama architecture"):
        ModelConfig(name="x", n_layers=2, d_model=32, n_heads=4, seq_len=8, batch_tokens=16, d_ff=64)
    with pytest.raises(ConfigError, match="divisible by n_kv_heads"):
        ModelConfig(name="x", architecture="llama", n_layers=2, d_model=32, n_heads=4, n_kv_heads=3, seq_len=8,
                    batch_tokens=16)


def test_export_takes_the_newest_step_that_the_peers_checkpoints_hold_whole(tmp_path):
    """Peer a holds stage 0 at steps 4 and 8, peer b stage 1 at step 4 only: step 4 is the newest whole model."""
    cut = CUTS["2 stages"]
    at_4, at_8 = _stages(TINY_LLAMA, cut, seed=1), _stages(TINY_LLAMA, cut, seed=2)
    saves = [("a", at_4[0], 4), ("b", at_4[1], 4), ("a", at_8[0], 8)]
    for peer, stage, step in saves:
        optimizer = torch.optim.AdamW(stage.parameters())
        CheckpointDir(tmp_path / peer, "exports").save(StageState.capture(stage, optimizer, step), layers=stage.layers,
                                                        model=TINY_LLAMA, plan_version=1)
    out = tmp_path / "model"
    dirs = ["--checkpoint-dir", str(tmp_path / "a"), "--checkpoint-dir", str(tmp_path / "b"), "--swarm", "exports"]
    result = CliRunner().invoke(app, ["export", "--out", str(out), *dirs])
    assert result.exit_code == 0, result.output
    assert "at step 4" in result.output
    exported = AutoModelForCausalLM.from_pretrained(out).eval()
    tokens = _tokens(TINY_LLAMA)
    with torch.no_grad():
        torch.testing.assert_close(exported(input_ids=tokens).logits, chain(at_4, tokens), rtol=0, atol=1e-5)
    result = CliRunner().invoke(app, ["export", "--out", str(tmp_path / "half"), *dirs[:2], "--swarm", "exports"])
    assert isinstance(result.exception, ConfigError)
    assert "step 8 lacks blocks.2, blocks.3, head; step 4 lacks blocks.2, blocks.3, head" in str(result.exception)


def _exported_logits_equal_the_swarm_s(model: ModelConfig, trained: dict[str, torch.Tensor], out: Path
                                       ) -> list[StageModule]:
    """Export `trained` (every stage's parameters, by our names), load it in transformers, and compare its logits
    with the swarm's own stages holding those parameters; returns those stages."""
    exported = AutoModelForCausalLM.from_pretrained(export_folder(model, trained, out)).eval()
    stages = _stages(model, model.stage_layers(D_PP), seed=SEED + 1)
    for stage in stages:
        stage.load_state_dict({name: trained[name] for name in stage.state_dict()})
    tokens = _tokens(model)
    with torch.no_grad():
        torch.testing.assert_close(exported(input_ids=tokens).logits, chain(stages, tokens), rtol=0, atol=1e-5)
    return stages


def _pipeline_0(results: list[dict], key) -> dict[str, torch.Tensor]:
    """Pipeline 0's stages' parameters after training, after checking that pipeline 1's replicas equal them."""
    trained = {name: t for r in results if r["replica"] == 0 for name, t in key(r).items()}
    for replica in (r for r in results if r["replica"] != 0):
        for name, tensor in key(replica).items():
            assert torch.equal(tensor, trained[name]), name
    return trained


@pytest.mark.swarm
@pytest.mark.timeout(200)
def test_the_export_of_what_a_gpt2_swarm_trained_gives_its_logits_and_its_text_in_transformers(golden_tiny, tmp_path):
    """The byte-level model a swarm trained: `hetswarm generate` on its export continues a prompt as its own
    stages do, greedily, one byte per token."""
    trained = _pipeline_0(golden_tiny, lambda result: result["states"][TINY_RUN.steps])
    stages = _exported_logits_equal_the_swarm_s(TINY_RUN.model, trained, tmp_path / "gpt2")
    prompt = "The swarm"
    expected = bytes(greedy(stages, list(prompt.encode()), 12)).decode("utf-8", errors="replace")
    assert sample(tmp_path / "gpt2", prompt, max_new_tokens=12, temperature=0) == expected
    result = CliRunner().invoke(app, ["generate", str(tmp_path / "gpt2"), "--prompt", prompt, "--max-new-tokens",
                                      "12", "--temperature", "0"])
    assert result.exit_code == 0, result.output
    assert result.output.startswith(prompt + expected), result.output


def _saved_llama(folder: Path, seed: int, *, tied: bool = False) -> Path:
    """A byte-level tiny LlamaForCausalLM, saved; `seed` draws its weights."""
    torch.manual_seed(seed)
    LlamaForCausalLM(LlamaConfig(vocab_size=256, hidden_size=32, intermediate_size=72, num_hidden_layers=4,
                                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                                 tie_word_embeddings=tied)).save_pretrained(folder)
    return folder


def test_the_plan_names_the_initial_weights_and_a_peer_with_other_weights_refuses_naming_both(tmp_path):
    ours, theirs = _saved_llama(tmp_path / "ours", seed=0), _saved_llama(tmp_path / "theirs", seed=1)
    assert weights_digest(ours) == weights_digest(ours) != weights_digest(theirs)
    model = starting_from(load_model(str(ours)), ours)
    assert model.init_digest == weights_digest(ours)
    with pytest.raises(ConfigError, match="is not the shape of --model 'tiny'"):
        starting_from(load_model("tiny"), ours)
    stage = build_stage(model, 1, 2, seed=0)
    with pytest.raises(ConfigError, match=f"SHA-256 {weights_digest(theirs)}, the plan's initial weights "
                                          f"{model.init_digest}"):
        load_initial_weights(stage, theirs)
    with pytest.raises(ConfigError, match="give `hetswarm join --model-dir`"):
        load_initial_weights(stage, None)
    load_initial_weights(stage, ours)
    saved = load_file(ours / "model.safetensors")
    for name, tensor in stage.state_dict().items():
        assert torch.equal(tensor, saved[llama.to_hf_name(name)]), name
    retrained = load_file(ours / "model.safetensors") | {"lm_head.weight": saved["lm_head.weight"] + 1}
    save_file(retrained, ours / "model.safetensors")  # the same folder with other weights: another digest
    assert weights_digest(ours) != model.init_digest


@pytest.mark.swarm
@pytest.mark.timeout(300)
def test_a_2x2_swarm_fine_tunes_a_saved_tied_llama_as_one_process_does_and_its_export_gives_its_logits(tmp_path):
    """Four processes start from a byte-level tiny Llama's folder (each peer its stage's tensors), whose output head
    is its token embedding, and train it 20 steps: the first step is the single-process one from the same weights
    (the tied matrix's gradient summed over both its copies), the copies on the first and last stages stay equal,
    the loss falls, and transformers computes from the export what the swarm's stages compute."""
    folder = _saved_llama(tmp_path / "pretrained", seed=3, tied=True)
    model = replace(starting_from(load_model(str(folder)), folder), batch_tokens=8 * 32, micro_batches=2)
    assert model.tie_embeddings
    steps = 20
    results = train_swarm(tmp_path, swarm="llama", steps=steps, model=model, seed=SEED, config=LR3_CONFIG,
                          save_first_grads=True, save_final_state=True, model_dir=folder, timeout_s=240)
    assert_first_step_is_the_reference(results, model, d_pp=D_PP, d_dp=D_DP, model_dir=folder)
    losses = [sum(r["reports"][step]["loss"] for r in results if r["stage"] == D_PP - 1) / D_DP
              for step in range(steps)]
    assert sum(losses[-3:]) / 3 < losses[0] - 0.5, losses
    trained = _pipeline_0(results, lambda result: result["final_state"])
    assert torch.equal(trained[EMBEDDING_MATRIX], trained[HEAD_MATRIX])
    _exported_logits_equal_the_swarm_s(model, trained, tmp_path / "llama")
