"""`hetswarm data prepare`: text, JSON lines and parquet files into the token files a swarm trains on."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from hetswarm.client.cli.options import console, new_app

data_app = new_app(no_args_is_help=True, help="Prepare training data: tokenized, split, hashed.")


@data_app.command()
def prepare(
    inputs: Annotated[list[Path], typer.Argument(help="Text (.txt, .md: a document each), JSON lines (.jsonl: its "
                                                      "\"text\" field) and parquet files (a \"text\" column), or "
                                                      "folders of them.")],
    out: Annotated[Path, typer.Option("--out", help="The folder to write; it must not exist yet.")],
    tokenizer: Annotated[Optional[Path], typer.Option(help="A tokenizer.json (the tokenizers library's) to "
                                                           "tokenize with.")] = None,
    train_tokenizer: Annotated[Optional[int], typer.Option(
        "--train-tokenizer", metavar="VOCAB", help="Instead, train a byte-level BPE tokenizer of VOCAB tokens on "
                                                   "the inputs.")] = None,
    validation_every: Annotated[int, typer.Option(help="Every N-th document goes to the validation split.")] = 100,
) -> None:
    """Tokenize documents into train.tokens and validation.tokens with an index and a digest; `hetswarm join --data
    OUT` trains on them, and `hetswarm coordinator --data OUT` pins the plan to them."""
    from hetswarm.client.training.prepared_data import prepare as prepare_folder  # tokenizers: only here

    with console.status(f"Tokenizing {len(inputs)} input(s) into {out}"):
        prepared = prepare_folder(inputs, out, tokenizer=tokenizer, train_vocab=train_tokenizer,
                                  validation_every=validation_every)
    splits = prepared.index["splits"]
    console.print(f"Prepared {out}: {splits['train']['tokens']:,} training tokens in {splits['train']['documents']:,}"
                  f" documents, {splits['validation']['tokens']:,} validation tokens in "
                  f"{splits['validation']['documents']:,}; vocabulary {prepared.vocab_size:,}; digest "
                  f"{prepared.digest}")
