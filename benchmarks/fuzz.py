"""Fuzzes the record validators, the frame decoder, the vote reader, the judge of shown failure votes and the reader
of part statements for a while and counts inputs and crashes.

    python fuzz.py --minutes 5        (from benchmarks/; writes its section of RESULTS.md)

The targets are those of tests/helpers/fuzzing.py (the test suite runs them for 1000 inputs each). A crash is any
exception other than a verdict; each is printed with its input, and the run goes on.
"""
from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
import traceback
from pathlib import Path

from hypothesis import HealthCheck, Phase, given, settings

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository, for tests.helpers
from results import command_line, write_section  # noqa: E402  (benchmarks/ is on sys.path as a script)

from hetswarm.client.peer.hivemind_compat import load_identity  # noqa: E402
from tests.helpers.fuzzing import targets  # noqa: E402


def fuzz(name: str, strategy, check, seconds: float) -> dict:
    """Runs `check` on inputs drawn from `strategy` until `seconds` pass; counts inputs, verdicts and crashes."""
    counts = {"inputs": 0, "accepted": 0, "crashes": 0}
    deadline = time.monotonic() + seconds

    @settings(max_examples=10**9, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def run(value) -> None:
        if time.monotonic() > deadline:
            raise _Done
        counts["inputs"] += 1
        try:
            counts["accepted"] += bool(check(value))
        except Exception:
            counts["crashes"] += 1
            print(f"{name}: crash on {value!r}\n{traceback.format_exc()}", file=sys.stderr)

    try:
        run()
    except _Done:
        pass
    return counts


class _Done(Exception):
    """Raised inside the property to end a timed run (hypothesis has no time budget of its own)."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=5.0, help="total time, split between the targets")
    args = parser.parse_args()
    logging.getLogger("hetswarm").setLevel(logging.ERROR)  # every refusal is logged; the counts say it here
    with tempfile.TemporaryDirectory() as folder:
        fuzzed = targets(load_identity(Path(folder) / "fuzz.key"))
        seconds = args.minutes * 60 / len(fuzzed)
        results = {name: fuzz(name, inputs, check, seconds) for name, (inputs, check) in fuzzed.items()}
    rows = "\n".join(f"| {name} | {r['inputs']} | {r['accepted']} | {r['inputs'] - r['accepted'] - r['crashes']} | "
                     f"{r['crashes']} |" for name, r in results.items())
    markdown = (f"`{command_line()}`: {args.minutes:g} minutes, an equal share per target (random values and "
                f"mutations of a valid record, frame, vote message, Progress record showing failure votes or part "
                f"statement; tests/helpers/fuzzing.py).\n\n"
                f"| target | inputs | accepted | refused | crashes |\n|---|---|---|---|---|\n{rows}\n")
    print(markdown)
    write_section("Fuzzing", markdown)


if __name__ == "__main__":
    main()
