"""Writes one benchmark's section of benchmarks/RESULTS.md, leaving the other benchmarks' sections as they are."""
from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

RESULTS_PATH = Path(__file__).with_name("RESULTS.md")
_HEADER = "# Benchmark results\n\nEach section is rewritten by the script named in it; the command that produced it is given.\n"


def command_line() -> str:
    """The command that is running now, as a user would type it from the repository root."""
    return " ".join(["python"] + [shlex.quote(arg) for arg in sys.argv])


def revision() -> str:
    """The checkout's commit as `git describe --always --dirty` gives it (a `-dirty` suffix for local changes)."""
    return subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True, text=True,
                          cwd=Path(__file__).parent).stdout.strip()


def write_section(name: str, markdown: str, *, path: Path = RESULTS_PATH) -> None:
    """Replaces (or appends) the section delimited by `<!-- name:begin -->` and `<!-- name:end -->`."""
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    block = f"{begin}\n{markdown.rstrip()}\n{end}"
    text = path.read_text() if path.exists() else _HEADER
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.DOTALL)
    if pattern.search(text):
        text = pattern.sub(lambda _: block, text)
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    path.write_text(text)
