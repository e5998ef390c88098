"""Hugging Face model folders in and out: a folder's config and its stage's tensors, and an export.

A folder is what ``save_pretrained`` writes: ``config.json`` and ``model.safetensors``, or shards listed in
``model.safetensors.index.json``. A stage reads only its own tensors, by key, from the shard that holds each
(safetensors' ``safe_open`` maps the file and copies only what is asked for), as Petals' servers load only their
blocks (petals/server/from_pretrained.py). An export writes a folder that ``AutoModelForCausalLM.from_pretrained``
loads with no hetswarm installed. Names and layouts per architecture: client/training/llama.py and gpt2_hf.py.
Nothing here downloads: the folder is the user's.
"""
from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType

import torch
from huggingface_hub import split_torch_state_dict_into_shards
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, PreTrainedTokenizerFast
from transformers.utils import logging as transformers_logging

from hetswarm.client.training import gpt2_hf, llama
from hetswarm.client.training.model import EMBEDDING_MATRIX, HEAD_MATRIX, StageModule
from hetswarm.client.training.prepared_data import TOKENIZER, PreparedData, files_key, hash_file
from hetswarm.protocol.errors import ConfigError
from hetswarm.protocol.model_config import ModelConfig

__all__ = ["export_folder", "load_initial_weights", "load_stage_tensors", "model_config_of", "same_shape", "sample",
           "weights_digest"]

_INDEX = "model.safetensors.index.json"
_SINGLE = "model.safetensors"
MAX_SHARD_BYTES = 5 * 10**9
"""transformers' default shard size: a larger model is exported in shards of at most this."""
_SHAPE_FIELDS = ("architecture", "n_layers", "d_model", "n_heads", "kv_heads", "ff_width", "vocab_size", "rope_theta",
                 "norm_eps", "tie_embeddings")
"""What a folder's weights must agree with in a model config (the sequence length and the batch are training's)."""
_digests: dict[tuple, str] = {}
"""weights_digest's answers, by the files' paths, sizes and modification times: a folder is hashed once."""
_LAYOUTS: dict[str, ModuleType] = {"llama": llama, "gpt2": gpt2_hf}
"""By ModelConfig.architecture, which is also transformers' model_type."""


def model_config_of(folder: Path, *, name: str | None = None, seq_len: int | None = None,
                    batch_tokens: int | None = None) -> ModelConfig:
    """The ModelConfig of a folder's ``config.json`` (LlamaForCausalLM or GPT2LMHeadModel); training's sequence
    length defaults to the model's context, and a step's tokens to eight sequences."""
    path = Path(folder) / "config.json"
    try:
        hf = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ConfigError(f"{path}: not a Hugging Face model config ({type(e).__name__}: {e})") from None
    if not isinstance(hf, dict) or (layout := _LAYOUTS.get(hf.get("model_type"))) is None:
        raise ConfigError(f"{path}: hetswarm reads model_type 'llama' and 'gpt2', not "
                          f"{hf.get('model_type') if isinstance(hf, dict) else hf!r}")
    try:
        return layout.model_config(hf, name=name or Path(folder).resolve().name, seq_len=seq_len,
                                   batch_tokens=batch_tokens)
    except KeyError as e:
        raise ConfigError(f"{path}: no {e.args[0]!r}; hetswarm reads model_type 'llama' and 'gpt2' configs with "
                          "their usual fields") from None
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None


def same_shape(config: ModelConfig, other: ModelConfig) -> bool:
    """Whether the two configs build tensors of the same names and shapes and compute the same function."""
    return all(getattr(config, field) == getattr(other, field) for field in _SHAPE_FIELDS)


def weights_digest(folder: Path) -> str:
    """SHA-256 (hex) over the folder's config.json and every safetensors file, in name order: what a plan names
    its initial weights by. Every byte is read once per process (hashlib runs at about 1 GB/s)."""
    folder = Path(folder)
    files = [folder / "config.json", *sorted(set(_shards(folder).values()))]
    key = files_key(files)
    if key not in _digests:
        digest = hashlib.sha256()
        for path in files:
            digest.update(f"{path.name}\0{path.stat().st_size}\0".encode())
            hash_file(path, digest)
        _digests[key] = digest.hexdigest()
    return _digests[key]


def load_initial_weights(module: StageModule, model_dir: Path | None) -> None:
    """Loads the stage's tensors of the folder the plan's model starts from (ModelConfig.init_digest).

    Raises:
        ConfigError: no folder was given, or its digest or shape is not the plan's (both digests named), or a
            tensor is missing or of another shape.
    """
    config = module.config
    wanted = config.init_digest
    if model_dir is None:
        raise ConfigError(f"the plan's model starts from the weights of a Hugging Face folder (SHA-256 {wanted}); "
                          "give `hetswarm join --model-dir` your copy of it")
    if (found := weights_digest(model_dir)) != wanted:
        raise ConfigError(f"--model-dir {model_dir} has SHA-256 {found}, the plan's initial weights {wanted}: "
                          "another model or another version of it")
    if not same_shape(model_config_of(model_dir), config):
        raise ConfigError(f"--model-dir {model_dir} is not the shape of the plan's model {config.name!r}")
    load_stage_tensors(model_dir, module)


def _shards(folder: Path) -> dict[str, Path]:
    """Which file holds each tensor of the folder."""
    if (index := folder / _INDEX).exists():
        weight_map = json.loads(index.read_text())["weight_map"]
        return {name: folder / file for name, file in weight_map.items()}
    if not (single := folder / _SINGLE).exists():
        raise ConfigError(f"{folder} holds neither {_SINGLE} nor {_INDEX}")
    with safe_open(single, framework="pt") as f:
        return {name: single for name in f.keys()}


def load_stage_tensors(folder: Path, module: StageModule) -> None:
    """Copies the folder's tensors of this stage into ``module``: each by key from its shard, nothing else read.
    A missing tensor or one of another shape is a one-line ConfigError naming it."""
    folder, config = Path(folder), module.config
    shards = _shards(folder)
    state = module.state_dict()
    by_file: dict[Path, list[str]] = {}
    for name in state:
        if (hf_name := _stored_name(config, name)) not in shards:
            raise ConfigError(f"{folder} has no tensor {hf_name!r}, which this stage holds")
        by_file.setdefault(shards[hf_name], []).append(name)
    layout = _LAYOUTS[config.architecture]
    with torch.no_grad():
        for file, names in by_file.items():
            with safe_open(file, framework="pt") as f:
                for name in names:
                    hf_name = _stored_name(config, name)
                    tensor = f.get_tensor(hf_name)
                    tensor = tensor.t() if layout.is_transposed(name) else tensor
                    if tensor.shape != state[name].shape:
                        raise ConfigError(f"{file.name}: {hf_name} has shape {tuple(tensor.shape)}, the model's "
                                          f"config wants {tuple(state[name].shape)}")
                    state[name].copy_(tensor)


def export_folder(config: ModelConfig, tensors: Mapping[str, torch.Tensor], out: Path,
                  data: PreparedData | None = None, *, max_shard_bytes: int = MAX_SHARD_BYTES) -> Path:
    """Writes the whole model (``tensors`` by our names, every stage's; optimizer state is left out) as a
    Hugging Face folder, with the tokenizer of the prepared ``data`` it was trained on; the folder appears complete
    or not at all (written beside, then renamed). Weights over `max_shard_bytes` go into shards with an index, as
    transformers' own `save_pretrained` writes them (huggingface_hub's split_torch_state_dict_into_shards)."""
    out, layout = Path(out), _LAYOUTS[config.architecture]
    if out.exists():
        raise ConfigError(f"{out} exists; export to a new folder")
    names = [name for name in _all_names(config) if not (config.tie_embeddings and name == HEAD_MATRIX)]
    if missing := sorted(set(names) - set(tensors)):
        raise ConfigError(f"cannot export {config.name!r}: {len(missing)} tensors missing, first {missing[0]!r}")
    partial = out.with_name(f".{out.name}.partial")
    partial.mkdir(parents=True, exist_ok=True)
    hf = layout.hf_config(config)
    hf.architectures = [{"llama": "LlamaForCausalLM", "gpt2": "GPT2LMHeadModel"}[config.architecture]]
    if data is not None:
        _save_tokenizer(data, partial)
        hf.eos_token_id = data.index["end_of_text"]
    hf.save_pretrained(partial)
    GenerationConfig.from_model_config(hf).save_pretrained(partial)
    weights = {layout.to_hf_name(name): _as_stored(tensors[name], layout.is_transposed(name)) for name in names}
    split = split_torch_state_dict_into_shards(weights, max_shard_size=max_shard_bytes)
    for file, shard in split.filename_to_tensors.items():
        save_file({name: weights[name] for name in shard}, partial / file, metadata={"format": "pt"})
    if split.is_sharded:
        index = {"metadata": {"total_size": split.metadata["total_size"]}, "weight_map": split.tensor_to_filename}
        (partial / _INDEX).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    os.replace(partial, out)
    return out


def _save_tokenizer(data: PreparedData, folder: Path) -> None:
    """The data's tokenizer as transformers' AutoTokenizer loads it (tokenizer.json, tokenizer_config.json)."""
    end = data.index["end_of_text"]
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(data.folder / TOKENIZER))
    if end is not None:
        tokenizer.eos_token = tokenizer.convert_ids_to_tokens(end)
    tokenizer.save_pretrained(folder)


def sample(folder: Path, prompt: str, *, max_new_tokens: int = 64, temperature: float = 0.8, seed: int = 0) -> str:
    """The prompt continued by the model of an exported folder, through transformers alone; text is tokenized by
    the folder's tokenizer, or else as UTF-8 bytes (the byte-level models). Greedy when ``temperature`` is 0."""
    transformers_logging.disable_progress_bar()  # its loading bar would fall between the prompt and the sample
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    context = model.config.max_position_embeddings  # GPT2Config maps it to n_positions
    max_new_tokens = max(1, min(max_new_tokens, context - 1))
    tokenizer = AutoTokenizer.from_pretrained(folder) if (Path(folder) / TOKENIZER).exists() else None
    ids = tokenizer(prompt).input_ids if tokenizer is not None else list(prompt.encode())
    ids = ids[-(context - max_new_tokens):] or [0]  # the model sees at most its context
    torch.manual_seed(seed)
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=max_new_tokens, do_sample=temperature > 0,
                             temperature=temperature if temperature > 0 else None, top_k=None, top_p=None,
                             pad_token_id=model.config.eos_token_id or 0)
    new = out[0, len(ids):].tolist()
    return tokenizer.decode(new, skip_special_tokens=True) if tokenizer is not None \
        else bytes(token for token in new if token < 256).decode("utf-8", errors="replace")


def _stored_name(config: ModelConfig, name: str) -> str:
    """The checkpoint's name of our tensor `name`: a tied head's matrix is stored once, as the embedding."""
    shared = config.tie_embeddings and name == HEAD_MATRIX
    return _LAYOUTS[config.architecture].to_hf_name(EMBEDDING_MATRIX if shared else name)


def _as_stored(tensor: torch.Tensor, transposed: bool) -> torch.Tensor:
    tensor = tensor.detach().to("cpu")
    return (tensor.t() if transposed else tensor).contiguous()


def _all_names(config: ModelConfig) -> list[str]:
    """Every parameter name of the whole model, ours (from the model built on the meta device: no memory)."""
    with torch.device("meta"):
        full = StageModule(config, (0, config.n_layers), is_first=True, is_last=True)
    return list(full.state_dict())
