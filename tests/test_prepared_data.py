"""`hetswarm data prepare`: documents of text, JSON lines and parquet files become token files with an index and a
digest that the same inputs always reproduce; a swarm trains on them, and the plan pins them.

The inputs and the tokenizers are made here (nothing is downloaded): paragraphs of the built-in corpus.
"""
import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from tokenizers import Tokenizer
from transformers import AutoTokenizer
from typer.testing import CliRunner

from hetswarm.client.cli.app import app
from hetswarm.client.cli.coordinator import trained_on
from hetswarm.client.training.data import DataError, TokenSource, default_corpus
from hetswarm.client.training.errors import StageError
from hetswarm.client.training.hf_folder import export_folder, sample
from hetswarm.client.training.model import build_stage
from hetswarm.client.training.prepared_data import END_OF_TEXT, PreparedData, prepare, read_documents
from hetswarm.client.training.stage_start import check_data
from hetswarm.protocol.errors import ConfigError
from hetswarm.protocol.model_config import ModelConfig
from tests.helpers.golden_runs import LR3_CONFIG
from tests.helpers.stage_chain import greedy
from tests.helpers.tiny_training import D_DP, D_PP, SEED, assert_first_step_is_the_reference, train_swarm

VOCAB = 300
LLAMA = ModelConfig(name="tokens", architecture="llama", n_layers=4, d_model=32, n_heads=4, n_kv_heads=2, d_ff=64,
                    vocab_size=320, seq_len=32, batch_tokens=8 * 32, micro_batches=2)
PARAGRAPHS = default_corpus(60_000).decode().split("\n\n")


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> list[Path]:
    """A text file, a JSON lines file and a parquet file: 1 + 40 + the rest of the paragraphs as documents."""
    folder = tmp_path_factory.mktemp("inputs")
    (folder / "notes.txt").write_text(PARAGRAPHS[0])
    (folder / "docs.jsonl").write_text("".join(json.dumps({"text": p, "id": i}) + "\n"
                                               for i, p in enumerate(PARAGRAPHS[1:41])))
    pq.write_table(pa.table({"text": PARAGRAPHS[41:], "id": list(range(len(PARAGRAPHS) - 41))}),
                   folder / "rest.parquet")
    return [folder / "notes.txt", folder / "docs.jsonl", folder / "rest.parquet"]


@pytest.fixture(scope="module")
def prepared(inputs, tmp_path_factory) -> PreparedData:
    return prepare(inputs, tmp_path_factory.mktemp("prepared") / "data", train_vocab=VOCAB, validation_every=10)


def test_every_document_of_every_kind_is_read_in_order(inputs):
    assert list(read_documents(inputs)) == PARAGRAPHS


def test_the_same_inputs_give_the_same_files_and_digest(inputs, prepared, tmp_path):
    again = prepare(inputs, tmp_path / "again", train_vocab=VOCAB, validation_every=10)
    assert again.digest == prepared.digest
    for name in ("train.tokens", "validation.tokens", "tokenizer.json", "index.json"):
        assert (again.folder / name).read_bytes() == (prepared.folder / name).read_bytes(), name
    other = prepare(inputs, tmp_path / "other-split", train_vocab=VOCAB, validation_every=11)
    assert other.digest != prepared.digest


def test_the_splits_decode_to_the_documents_each_ended_by_the_end_of_text_token(prepared):
    tokenizer = Tokenizer.from_file(str(prepared.folder / "tokenizer.json"))
    end = tokenizer.token_to_id(END_OF_TEXT)
    assert prepared.vocab_size == tokenizer.get_vocab_size() == VOCAB and prepared.index["dtype"] == "uint16"
    for split, documents in (("validation", PARAGRAPHS[::10]),
                             ("train", [p for i, p in enumerate(PARAGRAPHS) if i % 10])):
        tokens = prepared.split(split)
        ends = np.flatnonzero(tokens == end)
        assert len(ends) == len(documents) and ends[-1] == len(tokens) - 1
        starts = np.concatenate([[0], ends[:-1] + 1])
        decoded = [tokenizer.decode(tokens[a:b].tolist()) for a, b in zip(starts, ends)]
        assert decoded == documents, split


def test_a_given_tokenizer_gives_the_tokens_the_trained_one_gave(inputs, prepared, tmp_path):
    given = prepare(inputs, tmp_path / "given", tokenizer=prepared.folder / "tokenizer.json", validation_every=10)
    assert np.array_equal(given.split("train"), prepared.split("train"))
    assert given.digest == prepared.digest


def test_the_cli_prepares_a_folder_and_a_swarm_reads_it(inputs, prepared, tmp_path):
    out = tmp_path / "cli"
    result = CliRunner().invoke(app, ["data", "prepare", *map(str, inputs), "--out", str(out), "--train-tokenizer",
                                      str(VOCAB), "--validation-every", "10"])
    assert result.exit_code == 0, result.output
    assert prepared.digest in result.output.replace("\n", "")
    source = TokenSource.from_path(out)
    assert (source.digest, source.vocab_size) == (prepared.digest, VOCAB)
    inputs_, targets = source.batch(step=3, pipeline=1, n_pipelines=2, micro_batch=0, micro_batch_size=4, seq_len=16)
    assert inputs_.shape == (4, 16) and int(inputs_.max()) < VOCAB and inputs_.dtype == torch.int64
    assert np.array_equal(inputs_[:, 1:].numpy(), targets[:, :-1].numpy())


def test_a_changed_token_file_or_index_is_refused_naming_it(prepared, tmp_path):
    copy = Path(shutil.copytree(prepared.folder, tmp_path / "copy"))
    tokens = bytearray((copy / "train.tokens").read_bytes())
    tokens[10] ^= 1
    (copy / "train.tokens").write_bytes(bytes(tokens))
    with pytest.raises(DataError, match=r"train\.tokens: its SHA-256 is not the one index\.json gives"):
        TokenSource.from_path(copy)
    index = json.loads((copy / "index.json").read_text())
    (copy / "index.json").write_text(json.dumps(index | {"vocab_size": 256}))
    with pytest.raises(DataError, match="its digest is not the SHA-256 of its contents"):
        TokenSource.from_path(copy)


def test_bad_inputs_and_options_are_one_line_errors(inputs, tmp_path):
    (tmp_path / "bad.jsonl").write_text('{"text": "fine"}\n{"body": "no text"}\n')
    with pytest.raises(DataError, match=r"bad\.jsonl:2: not a JSON object with a \"text\" field"):
        list(read_documents([tmp_path / "bad.jsonl"]))
    with pytest.raises(DataError, match="one of them"):
        prepare(inputs, tmp_path / "none", validation_every=10)
    with pytest.raises(DataError, match="need both"):
        prepare(inputs[:1], tmp_path / "one-document", train_vocab=VOCAB)
    assert not (tmp_path / "one-document").exists()


def test_a_vocabulary_beyond_the_model_s_and_other_data_are_refused(prepared):
    model = ModelConfig(name="bytes", n_layers=2, d_model=32, n_heads=4, seq_len=16, batch_tokens=64)
    with pytest.raises(ConfigError, match=f"vocabulary of {VOCAB}, more than the 256 tokens of --model 'bytes'"):
        trained_on(model, prepared.folder)
    pinned = trained_on(replace(model, vocab_size=VOCAB), prepared.folder)
    assert pinned.data_digest == prepared.digest
    check_data(pinned, TokenSource.from_path(prepared.folder))
    text = TokenSource.from_path(None)
    with pytest.raises(StageError, match=f"SHA-256 {text.digest}, the plan trains on data with SHA-256 "
                                         f"{prepared.digest}"):
        check_data(pinned, text)
    with pytest.raises(StageError, match=f"vocabulary of {VOCAB}, more than the 256 tokens"):
        check_data(model, TokenSource.from_path(prepared.folder))


@pytest.mark.swarm
@pytest.mark.timeout(300)
def test_a_swarm_pinned_to_prepared_data_trains_on_it_as_one_process_does(prepared, tmp_path):
    model = trained_on(LLAMA, prepared.folder)
    results = train_swarm(tmp_path, swarm="tokens", steps=2, model=model, seed=SEED, config=LR3_CONFIG,
                          save_first_grads=True, data_path=prepared.folder, timeout_s=240)
    assert_first_step_is_the_reference(results, model, d_pp=D_PP, d_dp=D_DP, data_path=prepared.folder)


def test_an_export_carries_the_data_s_tokenizer_and_samples_what_the_stages_would(prepared, tmp_path):
    model = trained_on(LLAMA, prepared.folder)
    stages = [build_stage(model, s, 2, seed=4) for s in range(2)]
    out = export_folder(model, {n: t for stage in stages for n, t in stage.state_dict().items()}, tmp_path / "m",
                        prepared)
    tokenizer = AutoTokenizer.from_pretrained(out)
    ours = Tokenizer.from_file(str(prepared.folder / "tokenizer.json"))
    assert tokenizer(PARAGRAPHS[3]).input_ids == ours.encode(PARAGRAPHS[3]).ids
    assert tokenizer.eos_token == END_OF_TEXT
    prompt = "The swarm"
    expected = greedy(stages, tokenizer(prompt).input_ids, 10, end=tokenizer.eos_token_id)
    assert len(set(expected)) > 2
    assert sample(out, prompt, max_new_tokens=10, temperature=0) == tokenizer.decode(expected, skip_special_tokens=True)
