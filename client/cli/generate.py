"""`hetswarm generate`: a prompt continued by an exported model, through transformers alone."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from hetswarm.client.cli.options import console


def generate(
    folder: Annotated[Path, typer.Argument(help="A folder `hetswarm export` wrote (any Hugging Face causal LM).")],
    prompt: Annotated[str, typer.Option(help="The text to continue.")] = "",
    max_new_tokens: Annotated[int, typer.Option(help="Tokens to add (at most the model's context).")] = 64,
    temperature: Annotated[float, typer.Option(help="Sampling temperature; 0 takes the likeliest token.")] = 0.8,
    seed: Annotated[int, typer.Option(help="Seed of the sampling.")] = 0,
) -> None:
    """Sample from an exported model: the prompt, then what the model adds."""
    from hetswarm.client.training.hf_folder import sample  # transformers: only this command pays for it

    console.print(prompt, end="", markup=False, highlight=False)
    console.print(sample(folder, prompt, max_new_tokens=max_new_tokens, temperature=temperature, seed=seed),
                  style="bold", markup=False, highlight=False)
