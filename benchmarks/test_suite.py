"""Where the test suite's time goes, and whether it passes every time: runs of `bash .ci/run` from fresh clones.

    python benchmarks/test_suite.py --runs 5            # five fresh clones of HEAD, one after another
    python benchmarks/test_suite.py --log ci.log --section test-suite-before --title "..."   # a run made before

Each run clones the repository into a new folder beside the shared folder's copy (as CI lays it out), checks out
the commit that was HEAD when the script started (so that commits made meanwhile do not mix into the runs), runs
`bash .ci/run` there with CI=true, and keeps its output. The section written to benchmarks/RESULTS.md gives each
run's wall time (install included) and verdict, and, from the last run's `--durations` lines (pytest's
setup + call + teardown of each test, summed over the two passes of `make test`), the seconds of every test module
and of the slowest tests. On two xdist workers the modules' seconds add up to about twice the wall time.
"""
from __future__ import annotations

import argparse
import datetime
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results import command_line, write_section  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
_DURATION = re.compile(r"^\s*([0-9.]+)s (setup|call|teardown)\s+(tests/\S+)$", re.MULTILINE)
_SUMMARY = re.compile(r"^=+ (.*(?:passed|failed|error).*) in ([0-9.]+)s", re.MULTILINE)


def run_ci(log: Path, commit: str) -> tuple[float, int]:
    """`bash .ci/run` in a fresh clone at `commit` beside a copy of ../shared; returns (seconds, exit code)."""
    with tempfile.TemporaryDirectory(prefix="hetswarm-ci-") as folder:
        clone = Path(folder) / "main"
        subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True)
        subprocess.run(["git", "checkout", "--quiet", commit], cwd=clone, check=True)
        if (ROOT.parent / "shared").exists():
            shutil.copytree(ROOT.parent / "shared", Path(folder) / "shared")
        start = time.monotonic()
        with open(log, "wb") as output:
            code = subprocess.run(["bash", ".ci/run"], cwd=clone, stdout=output, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL, env={**os.environ, "CI": "true"}).returncode
        return time.monotonic() - start, code


def test_seconds(text: str) -> dict[str, float]:
    """Every test's setup + call + teardown seconds, from pytest's --durations lines."""
    seconds: dict[str, float] = defaultdict(float)
    for value, _, test in _DURATION.findall(text):
        seconds[test] += float(value)
    return dict(seconds)


def tables(text: str, slowest: int = 25) -> str:
    per_test = test_seconds(text)
    per_module: dict[str, float] = defaultdict(float)
    for test, value in per_test.items():
        per_module[test.split("::")[0]] += value
    lines = ["| module | seconds |", "|---|---|"]
    lines += [f"| `{module}` | {value:.1f} |" for module, value in sorted(per_module.items(), key=lambda kv: -kv[1])]
    lines += ["", f"The {slowest} slowest tests:", "", "| test | seconds |", "|---|---|"]
    lines += [f"| `{test}` | {value:.1f} |" for test, value in sorted(per_test.items(), key=lambda kv: -kv[1])[:slowest]]
    lines += ["", f"All tests together: {sum(per_test.values()):.0f} s over {len(per_test)} tests with a --durations "
                  "line; pytest's summaries: " + "; ".join(f"{s} in {t} s" for s, t in _SUMMARY.findall(text))]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=1, help="fresh-clone runs of .ci/run, one after another")
    parser.add_argument("--log", type=Path, help="only tabulate this output of an earlier run")
    parser.add_argument("--section", default="test-suite", help="the section of RESULTS.md to write")
    parser.add_argument("--title", default="Test suite: `bash .ci/run` from a fresh clone, 2 cores")
    parser.add_argument("--notes", default="", help="a paragraph to add under the title")
    parser.add_argument("--head", help="the commit the --log run tested (default: HEAD)")
    args = parser.parse_args()
    head = (args.head or subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                        text=True, check=True).stdout).strip()  # every run tests this one commit
    rows = []
    if args.log:
        text = args.log.read_text(errors="replace")
    else:
        for run in range(1, args.runs + 1):
            log = Path(tempfile.gettempdir()) / f"hetswarm-ci-{run}.log"
            seconds, code = run_ci(log, head)
            verdict = "passed" if code == 0 else f"FAILED (exit {code}; output in {log})"
            rows.append(f"| {run} | {seconds / 60:.1f} min | {verdict} | "
                        + "; ".join(s for s, _ in _SUMMARY.findall(log.read_text(errors="replace"))) + " |")
            print(rows[-1], flush=True)
        text = log.read_text(errors="replace")
    runs = "\n".join(["| run | wall (install included) | verdict | pytest |", "|---|---|---|---|", *rows]) if rows else ""
    write_section(args.section, f"""## {args.title}

`{command_line()}` at {head} on {datetime.date.today()}. {args.notes}

{runs}

Seconds per module and the slowest tests (setup + call + teardown, the last run):

{tables(text)}
""")


if __name__ == "__main__":
    main()
