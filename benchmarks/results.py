"""Writes one benchmark's section of benchmarks/RESULTS.md, leaving the other benchmarks' sections as they are."""
from __future__ import annotations

import re
import shlex
import subprocess
import sys
import time
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


def reference_work_s(repeats: int = 10) -> float:
    """The fastest of `repeats` timings of one fixed piece of single-threaded work (Python dict and list operations,
    then float32 matrix products in torch), taken before a benchmark starts: this 2-core machine's speed changes from
    day to day (the same test suite took 13.9 and 19.5 min), and swarm benchmarks that fill both cores change with it
    (RESULTS.md `swarm-scale`), so a section that gives it can be read against another day's. Calls on an idle
    machine differ by up to 10 %: a lead for differences of tens of percent, not a measurement of small ones."""
    import torch  # only the benchmarks that time a machine need it

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    a = torch.randn(256, 256, generator=torch.Generator().manual_seed(0))
    timings = []
    for _ in range(repeats):
        started = time.perf_counter()
        table = {i: str(i) for i in range(600_000)}
        sum(len(value) for value in sorted(table.values()))
        for _ in range(300):
            a @ a
        timings.append(time.perf_counter() - started)
    torch.set_num_threads(threads)
    return min(timings)


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
