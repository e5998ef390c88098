"""Tokenized training data: `hetswarm data prepare` turns text, JSON lines and parquet files into flat token files.

A prepared folder holds ``train.tokens`` and ``validation.tokens`` (the token ids of each split's documents, each
document followed by the end-of-text token when the tokenizer has one, as little-endian uint16 when the vocabulary
fits in 16 bits, else uint32), the ``tokenizer.json`` that made them, and ``index.json``: the dtype, the
vocabulary size, each file's token count and SHA-256, and the folder's digest over all of them, by which a plan
names its data (as Psyche's and Templar's pre-tokenized shards are flat token files with an index). Training maps
the token files into memory (numpy.memmap), so data larger than memory trains too.

Documents: a .txt or .md file is one, a .jsonl line one (its "text" field), a parquet row one (its "text" column,
read with pyarrow); folders are read in sorted path order. Every ``validation_every``-th document (the first
included) goes to the validation split. The same inputs give the same bytes and the same digest.
"""
from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from hetswarm.client.training.data import DataError

__all__ = ["PreparedData", "files_key", "hash_file", "prepare", "read_documents"]

Split = Literal["train", "validation"]
SPLITS: tuple[Split, ...] = ("train", "validation")
INDEX, TOKENIZER = "index.json", "tokenizer.json"
END_OF_TEXT = "<|endoftext|>"
"""The end-of-text token a trained tokenizer gets (GPT-2's), and the first one looked for in a given tokenizer."""
_OTHER_ENDS = ("</s>", "<eos>", "<|end_of_text|>")
_SUFFIXES = {".txt": "text", ".md": "text", ".jsonl": "jsonl", ".parquet": "parquet"}
_HASH_CHUNK = 8 * 2**20
_verified: set[tuple] = set()
"""Folders whose token files were hashed in this process, by their paths, sizes and modification times."""


def read_documents(inputs: Sequence[Path]) -> Iterator[str]:
    """Every document of the inputs, in order (module docstring).

    Raises:
        DataError: an input is missing or of an unknown kind, or a JSON line has no "text".
    """
    for path in inputs:
        if path.is_dir():
            yield from read_documents(sorted(p for p in path.rglob("*") if p.suffix.lower() in _SUFFIXES))
        elif not path.is_file() or path.suffix.lower() not in _SUFFIXES:
            raise DataError(f"{path}: not a file or folder of {', '.join(_SUFFIXES)} files")
        elif _SUFFIXES[path.suffix.lower()] == "text":
            yield path.read_text(encoding="utf-8")
        elif _SUFFIXES[path.suffix.lower()] == "jsonl":
            yield from _json_lines(path)
        else:
            yield from _parquet_rows(path)


def _json_lines(path: Path) -> Iterator[str]:
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                text = json.loads(line)["text"]
            except (json.JSONDecodeError, KeyError, TypeError) as e:
                raise DataError(f"{path}:{number}: not a JSON object with a \"text\" field ({e!r})") from None
            yield str(text)


def _parquet_rows(path: Path) -> Iterator[str]:
    import pyarrow.parquet as pq  # parquet inputs only

    table = pq.ParquetFile(path)
    if "text" not in table.schema_arrow.names:
        raise DataError(f"{path}: no \"text\" column (columns: {', '.join(table.schema_arrow.names)})")
    for batch in table.iter_batches(columns=["text"]):
        yield from (str(text) for text in batch.column(0).to_pylist() if text is not None)


def prepare(inputs: Sequence[Path], out: Path, *, tokenizer: Path | None = None, train_vocab: int | None = None,
            validation_every: int = 100) -> PreparedData:
    """Tokenizes the inputs into a new folder ``out`` (module docstring) with the tokenizer file ``tokenizer``,
    or with a byte-level BPE of ``train_vocab`` tokens trained on the inputs; the folder appears whole or not at
    all (written beside, then renamed)."""
    from tokenizers import Tokenizer  # `hetswarm data prepare` only

    if (tokenizer is None) == (train_vocab is None):
        raise DataError("give --tokenizer FILE or --train-tokenizer VOCAB, one of them")
    if validation_every < 2:
        raise DataError(f"--validation-every must be at least 2, got {validation_every}")
    if out.exists():
        raise DataError(f"{out} exists; prepare into a new folder")
    made = _train_tokenizer(inputs, train_vocab) if tokenizer is None else Tokenizer.from_file(str(tokenizer))
    vocab_size = made.get_vocab_size(with_added_tokens=True)
    dtype = np.dtype("<u2") if vocab_size <= 2**16 else np.dtype("<u4")
    end = next((made.token_to_id(t) for t in (END_OF_TEXT, *_OTHER_ENDS) if made.token_to_id(t) is not None), None)
    partial = out.with_name(f".{out.name}.partial")
    partial.mkdir(parents=True, exist_ok=True)
    made.save(str(partial / TOKENIZER))
    counts = _write_splits(inputs, made, partial, dtype=dtype, end=end, validation_every=validation_every)
    files = {split: {"file": f"{split}.tokens", "tokens": counts[split][0], "documents": counts[split][1],
                     "sha256": _file_sha256(partial / f"{split}.tokens")} for split in SPLITS}
    if not all(files[split]["tokens"] for split in SPLITS):
        raise DataError(f"the inputs give {files['train']['documents']} training and {files['validation']['documents']}"
                        f" validation documents with tokens; need both (at least {validation_every + 1} documents)")
    index = {"dtype": dtype.name, "vocab_size": vocab_size, "end_of_text": end, "splits": files,
             "tokenizer_sha256": _file_sha256(partial / TOKENIZER)}
    index["digest"] = _digest_of(index)
    (partial / INDEX).write_text(json.dumps(index, indent=1, sort_keys=True))
    os.replace(partial, out)
    return PreparedData.open(out)


def _train_tokenizer(inputs: Sequence[Path], vocab: int):
    """A byte-level BPE (GPT-2's scheme) of ``vocab`` tokens, END_OF_TEXT among them, trained on the inputs."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    made = Tokenizer(models.BPE())
    made.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    made.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=[END_OF_TEXT], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    made.train_from_iterator(read_documents(inputs), trainer=trainer)
    return made


def _write_splits(inputs: Sequence[Path], made, folder: Path, *, dtype: np.dtype, end: int | None,
                  validation_every: int) -> dict[Split, tuple[int, int]]:
    """Writes each document's tokens to its split's file; (tokens, documents) of each split."""
    counts = {split: [0, 0] for split in SPLITS}
    files = {split: open(folder / f"{split}.tokens", "wb") for split in SPLITS}
    try:
        for number, text in enumerate(read_documents(inputs)):
            ids = made.encode(text).ids + ([end] if end is not None else [])
            split: Split = "validation" if number % validation_every == 0 else "train"
            np.asarray(ids, dtype=dtype).tofile(files[split])
            counts[split][0] += len(ids)
            counts[split][1] += 1
    finally:
        for f in files.values():
            f.close()
    return {split: (tokens, documents) for split, (tokens, documents) in counts.items()}


def hash_file(path: Path, digest: "hashlib._Hash") -> "hashlib._Hash":
    """Feeds the file's bytes to ``digest`` in bounded chunks (files may be larger than memory)."""
    with open(path, "rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest


def files_key(paths: Sequence[Path]) -> tuple:
    """The files' paths, sizes and modification times: what a once-per-process hash of them is remembered by."""
    return tuple((str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns) for p in paths)


def _file_sha256(path: Path) -> str:
    return hash_file(path, hashlib.sha256()).hexdigest()


def _digest_of(index: dict[str, Any]) -> str:
    """The folder's digest: SHA-256 of its index without the digest, as canonical JSON."""
    fields = {key: value for key, value in index.items() if key != "digest"}
    return hashlib.sha256(json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class PreparedData:
    """A prepared folder, its files checked against its index."""

    folder: Path
    index: dict[str, Any]

    @classmethod
    def open(cls, folder: Path) -> PreparedData:
        """Reads the index and checks every file against it: its size and, once per process, its SHA-256.

        Raises:
            DataError: the index is unreadable, or a file is missing or not what the index says.
        """
        try:
            index = json.loads((folder / INDEX).read_text())
            paths = {split: folder / index["splits"][split]["file"] for split in SPLITS}
            dtype = np.dtype(index["dtype"])
            sizes = {split: index["splits"][split]["tokens"] * dtype.itemsize for split in SPLITS}
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise DataError(f"{folder}: not a folder `hetswarm data prepare` wrote ({type(e).__name__}: {e})") from None
        if _digest_of(index) != index.get("digest"):
            raise DataError(f"{folder / INDEX}: its digest is not the SHA-256 of its contents; prepare it again")
        for split, path in paths.items():
            if not path.is_file() or path.stat().st_size != sizes[split]:
                raise DataError(f"{path}: missing or not {sizes[split]} bytes as {INDEX} says")
        key = files_key(list(paths.values()))
        if key not in _verified:
            for split, path in paths.items():
                if _file_sha256(path) != index["splits"][split]["sha256"]:
                    raise DataError(f"{path}: its SHA-256 is not the one {INDEX} gives; prepare it again")
            _verified.add(key)
        return cls(folder, index)

    @property
    def vocab_size(self) -> int:
        return int(self.index["vocab_size"])

    @property
    def digest(self) -> str:
        return str(self.index["digest"])

    def split(self, name: Split) -> np.ndarray:
        """The split's token ids, mapped from its file (read-only)."""
        return np.memmap(self.folder / self.index["splits"][name]["file"], dtype=np.dtype(self.index["dtype"]),
                         mode="r")
