"""Byte-level data: deterministic micro-batches, one shard per pipeline, clear errors for unusable corpora."""
import pytest
import torch

from hetswarm.client.training.data import DataError, TokenSource, default_corpus, sequences_per_micro_batch
from hetswarm.protocol.errors import HetswarmError
from hetswarm.protocol.model_config import get_model_config

SEQ_LEN = 16


def _draw(source, **overrides):
    args = dict(step=3, pipeline=0, n_pipelines=2, micro_batch=1, micro_batch_size=4, seq_len=SEQ_LEN) | overrides
    return source.batch(**args)


def test_batches_are_a_function_of_step_pipeline_and_micro_batch():
    corpus = default_corpus(50_000)
    inputs, targets = _draw(TokenSource(corpus))
    again = _draw(TokenSource(corpus))  # e.g. the last stage, in another process
    assert torch.equal(inputs, again[0]) and torch.equal(targets, again[1])
    assert inputs.shape == targets.shape == (4, SEQ_LEN) and inputs.dtype == torch.long
    assert torch.equal(inputs[:, 1:], targets[:, :-1])
    for other in (dict(step=4), dict(micro_batch=0), dict(pipeline=1)):
        assert not torch.equal(_draw(TokenSource(corpus), **other)[0], inputs), other
    assert not torch.equal(_draw(TokenSource(corpus, seed=1))[0], inputs)


def test_targets_are_the_next_bytes_of_the_corpus():
    corpus = bytes(range(200))  # every byte value once: a window is identified by its first byte
    inputs, targets = _draw(TokenSource(corpus), n_pipelines=1)
    for row_in, row_target in zip(inputs.tolist(), targets.tolist()):
        start = row_in[0]
        assert row_in == list(corpus[start : start + SEQ_LEN])
        assert row_target == list(corpus[start + 1 : start + SEQ_LEN + 1])


def test_each_pipeline_reads_only_its_own_shard():
    source = TokenSource(b"a" * 1000 + b"b" * 1000 + b"c" * 1000)
    for pipeline, byte in enumerate(b"abc"):
        for step in range(5):
            inputs, targets = _draw(source, step=step, pipeline=pipeline, n_pipelines=3)
            assert set(inputs.flatten().tolist()) | set(targets.flatten().tolist()) == {byte}


def test_default_corpus_is_deterministic_text():
    corpus = default_corpus(10_000)
    assert corpus == default_corpus(10_000) != default_corpus(10_000, seed=1)
    assert len(corpus) == 10_000 and corpus.decode().isascii()
    assert len(TokenSource.from_path(None).tokens) > 100_000


def test_folder_is_read_as_its_sorted_text_files(tmp_path):
    (tmp_path / "b.md").write_bytes(b"second")
    (tmp_path / "a.txt").write_bytes(b"first")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "c.txt").write_bytes(b"third")
    (tmp_path / "skip.bin").write_bytes(b"binary")
    assert bytes(TokenSource.from_path(tmp_path).tokens.tolist()) == b"first\nsecond\nthird"
    assert bytes(TokenSource.from_path(tmp_path / "a.txt").tokens.tolist()) == b"first"


def test_unusable_data_is_refused_with_a_clear_error(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        TokenSource.from_path(tmp_path / "missing")
    with pytest.raises(DataError, match="holds no"):
        TokenSource.from_path(tmp_path)
    with pytest.raises(DataError, match="empty"):
        TokenSource(b"")
    with pytest.raises(DataError, match="fewer than seq_len \\+ 1 = 17"):
        _draw(TokenSource(b"x" * 40), n_pipelines=4)
    assert issubclass(DataError, HetswarmError)


def test_micro_batch_size_splits_the_step_over_pipelines_and_micro_batches():
    tiny = get_model_config("tiny")  # 8 sequences per step, 2 micro-batches
    assert [sequences_per_micro_batch(tiny, n) for n in (1, 2, 4, 8)] == [4, 2, 1, 1]


def test_a_step_trains_on_the_same_sequences_however_it_is_split_into_micro_batches():
    source = TokenSource(default_corpus(50_000))
    whole = source.batch(step=3, pipeline=1, n_pipelines=2, micro_batch=0, micro_batch_size=4, seq_len=16)[0]
    halves = [source.batch(step=3, pipeline=1, n_pipelines=2, micro_batch=m, micro_batch_size=2, seq_len=16)[0]
              for m in range(2)]
    assert torch.equal(whole, torch.cat(halves))
    assert not torch.equal(halves[0], halves[1])
