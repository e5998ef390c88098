"""Training data: the bytes of text (every byte a token, vocab 256: no tokenizer to download), or the tokens of a
folder `hetswarm data prepare` wrote (client/training/prepared_data.py).

The text is the user's (a file, or every *.txt and *.md file under a folder) or, with no path, English-like text
generated from a built-in word list by a seeded RNG, so `hetswarm demo` needs nothing from the internet and an
installed wheel carries no data file. Pipeline i of n reads only shard i (the i-th contiguous n-th of the tokens).
A micro-batch is a pure function of (seed, step, pipeline, micro-batch): the first stage (which needs the inputs)
and the last stage (which needs the targets) of a pipeline draw the same one without talking. Every source has a
SHA-256 digest, by which a plan names the data it trains on.

Held-out text, for the loss a plan measures every `eval_every` steps, is a prepared folder's validation split or,
for the generated corpus, more of it drawn with another seed; a user's text file has none (prepare it to get one).
"""
import hashlib
import random
from pathlib import Path

import numpy as np
import torch

from hetswarm.protocol.errors import HetswarmError
from hetswarm.protocol.model_config import ModelConfig

__all__ = ["DataError", "TokenSource", "default_corpus", "read_corpus", "sequences_per_micro_batch"]

DEFAULT_CORPUS_BYTES = 1 << 20
"""Size of the generated corpus: enough for the demo's small models to learn from without repeating a batch."""

HELD_OUT_BYTES, HELD_OUT_SEED = 1 << 16, 1
"""The generated held-out text: other paragraphs of the same kind as the training corpus (seed 0)."""

_TEXT_SUFFIXES = (".txt", ".md")

_SUBJECTS = ("the volunteer", "a peer", "the coordinator", "every stage", "the swarm", "a replica", "the monitor",
             "each pipeline", "the scheduler", "a new client", "the last stage", "the first stage")
_VERBS = ("sends", "receives", "averages", "measures", "schedules", "trains", "publishes", "refuses", "checks",
          "splits", "forwards", "stores")
_OBJECTS = ("the activations", "its gradients", "a new plan", "the link matrix", "the signed record",
            "every micro-batch", "the model weights", "a stream of bytes", "the loss", "its layers")
_ENDINGS = ("over the internet", "before the next step", "in lock-step", "with its neighbours", "at once",
            "after a short wait", "without a crash", "for the whole group", "on a slow link", "again and again")


class DataError(HetswarmError):
    """The training data cannot be used: a missing path, no text files, or a corpus too short to cut batches."""


def default_corpus(n_bytes: int = DEFAULT_CORPUS_BYTES, *, seed: int = 0) -> bytes:
    """Paragraphs of simple sentences drawn by a seeded RNG: the same bytes on every machine and version."""
    rng = random.Random(seed)
    paragraphs, size = [], 0
    while size < n_bytes:
        sentences = []
        for _ in range(rng.randint(3, 7)):
            words = (rng.choice(table) for table in (_SUBJECTS, _VERBS, _OBJECTS, _ENDINGS))
            sentence = " ".join(words)
            sentences.append(sentence[0].upper() + sentence[1:] + ".")
        paragraphs.append(" ".join(sentences))
        size += len(paragraphs[-1]) + 2
    return "\n\n".join(paragraphs).encode()[:n_bytes]


def read_corpus(path: Path) -> bytes:
    """The bytes of a file, or of every *.txt and *.md file under a folder in sorted path order, joined by newlines.

    Raises:
        DataError: the path does not exist, or a folder holds no text file.
    """
    if path.is_file():
        return path.read_bytes()
    if not path.is_dir():
        raise DataError(f"training data {str(path)!r} does not exist")
    files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in _TEXT_SUFFIXES)
    if not files:
        raise DataError(f"folder {str(path)!r} holds no {' or '.join(_TEXT_SUFFIXES)} file to train on")
    return b"\n".join(f.read_bytes() for f in files)


def sequences_per_micro_batch(config: ModelConfig, n_pipelines: int) -> int:
    """Sequences in one micro-batch of one pipeline: batch_tokens split over pipelines and micro-batches.

    Rounded down (at least one sequence), so a step may train on slightly fewer tokens than batch_tokens when the
    data-parallel degree does not divide the batch.
    """
    sequences = config.batch_tokens // config.seq_len
    return max(1, sequences // (n_pipelines * config.micro_batches))


class TokenSource:
    """Tokens from which any pipeline can draw any micro-batch of any step, deterministically."""

    def __init__(self, corpus: bytes | np.ndarray, *, seed: int = 0, vocab_size: int = 256,
                 digest: str | None = None, held_out: bytes | np.ndarray | None = None) -> None:
        """
        Args:
            corpus: text as bytes (each byte a token), or a 1-D array of token ids (a prepared folder's, mapped).
            vocab_size: one more than the largest token id the data may hold; a model needs at least this many.
            digest: SHA-256 of the data, hex, when known (a prepared folder's, checked); else computed here.
            held_out: tokens never trained on, as `corpus`, for the held-out loss; None when the data has none.
        """
        tokens = _tokens(corpus)
        if len(tokens) == 0:
            raise DataError("the training corpus is empty")
        self.tokens, self.seed, self.vocab_size = tokens, seed, vocab_size  # tokens: (N,)
        self.digest = digest or hashlib.sha256(np.ascontiguousarray(tokens)).hexdigest()
        self.held_out = None if held_out is None else _tokens(held_out)  # (H,)

    @classmethod
    def from_path(cls, path: str | Path | None, *, seed: int = 0) -> "TokenSource":
        """The data at ``path`` (a text file, a folder of them, or a prepared folder, as the user's --data gives
        it), or the default corpus."""
        if path is not None and (Path(path) / "index.json").is_file():
            from hetswarm.client.training.prepared_data import PreparedData  # tokens of `hetswarm data prepare`

            prepared = PreparedData.open(Path(path))
            return cls(prepared.split("train"), seed=seed, vocab_size=prepared.vocab_size, digest=prepared.digest,
                       held_out=prepared.split("validation"))
        if path is None:
            return cls(default_corpus(), seed=seed, held_out=default_corpus(HELD_OUT_BYTES, seed=HELD_OUT_SEED))
        return cls(read_corpus(Path(path)), seed=seed)

    def shard(self, pipeline: int, n_pipelines: int) -> np.ndarray:
        """The contiguous part of the corpus that pipeline ``pipeline`` of ``n_pipelines`` reads."""
        if not 0 <= pipeline < n_pipelines:
            raise ValueError(f"pipeline must be in [0, {n_pipelines}), got {pipeline}")
        n = len(self.tokens)
        return self.tokens[pipeline * n // n_pipelines : (pipeline + 1) * n // n_pipelines]

    def batch(
        self, *, step: int, pipeline: int, n_pipelines: int, micro_batch: int, micro_batch_size: int, seq_len: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Micro-batch ``micro_batch`` of pipeline ``pipeline`` at optimizer step ``step``.

        Each row is a window of seq_len + 1 tokens at a random offset in the pipeline's shard, the RNG seeded by
        (seed, step, pipeline, sequence) with sequence = micro_batch · micro_batch_size + row, so that a step trains
        on the same sequences however a plan splits it into micro-batches; the targets are the inputs shifted left
        by one token.

        Returns:
            (inputs, targets), both int64 of shape (micro_batch_size, seq_len).

        Raises:
            DataError: the shard is shorter than seq_len + 1 tokens.
        """
        shard = self.shard(pipeline, n_pipelines)
        windows = len(shard) - seq_len  # window starts 0 .. len - seq_len - 1
        if windows < 1:
            raise DataError(f"the corpus ({len(self.tokens)} tokens) cut into {n_pipelines} shards leaves "
                            f"{len(shard)} tokens for pipeline {pipeline}: fewer than seq_len + 1 = {seq_len + 1}")
        first = micro_batch * micro_batch_size
        starts = [int(np.random.SeedSequence([self.seed, step, pipeline, sequence]).generate_state(1, np.uint64)[0]
                      % windows) for sequence in range(first, first + micro_batch_size)]
        return _windows(shard, starts, seq_len)

    def held_out_problem(self, seq_len: int) -> str | None:
        """Why this data cannot give held-out windows of seq_len + 1 tokens, or None when it can."""
        if self.held_out is None:
            return "this data has no held-out split: prepare it with `hetswarm data prepare` to get one"
        if len(self.held_out) <= seq_len:
            return f"the held-out split has {len(self.held_out)} tokens: fewer than seq_len + 1 = {seq_len + 1}"
        return None

    def held_out_batch(self, *, micro_batch: int, micro_batch_size: int, micro_batches: int, seq_len: int
                       ) -> tuple[torch.Tensor, torch.Tensor]:
        """Micro-batch ``micro_batch`` of the held-out set: micro_batches × micro_batch_size windows spread evenly over
        the held-out tokens, the same for every pipeline and step, so that every pipeline measures the same model on
        the same text and their losses corroborate each other.

        Raises:
            DataError: the data has no held-out tokens, or fewer than seq_len + 1.
        """
        if (problem := self.held_out_problem(seq_len)) is not None:
            raise DataError(problem)
        windows = len(self.held_out) - seq_len
        total, first = micro_batches * micro_batch_size, micro_batch * micro_batch_size
        starts = [sequence * windows // total for sequence in range(first, first + micro_batch_size)]
        return _windows(self.held_out, starts, seq_len)


def _tokens(corpus: bytes | np.ndarray) -> np.ndarray:
    return np.frombuffer(corpus, dtype=np.uint8) if isinstance(corpus, bytes) else corpus


def _windows(tokens: np.ndarray, starts: list[int], seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets) of the windows of seq_len + 1 tokens at `starts`: int64, (len(starts), seq_len) each."""
    rows = torch.from_numpy(tokens[np.array(starts)[:, None] + np.arange(seq_len + 1)].astype(np.int64))  # (B, T+1)
    return rows[:, :-1], rows[:, 1:]  # (B, T), (B, T)
