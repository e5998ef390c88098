"""What the checks against hostile members cost a fault-free run: steps per minute with and without them.

The same 2 × 2 swarm of training processes on 127.0.0.1 (tests/helpers/tiny_training.py: the tiny model, fp32 on the
wire, a single DHT bootstrap node, no coordinator) trains `--steps` steps, alternately with the checks and without
them (tests/helpers/training_process.py, `unchecked`: every average and gradient part taken as it comes, votes
neither signed nor verified, parts sent without signed statements and no reducer audited), `--rounds` times each, the
order swapped every round so that neither variant always runs first on a warm machine. A step's time is its wall time
on the slowest peer; the first steps (start-up) are left out. Writes the "check-cost" section of
benchmarks/RESULTS.md.

    python benchmarks/check_cost.py [--steps 200] [--rounds 5]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import textwrap
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository, for tests.helpers
from results import command_line, write_section  # noqa: E402  (benchmarks/ is on sys.path as a script)

from hetswarm.client.peer.hivemind_compat import load_identity  # noqa: E402
from hetswarm.protocol.vote_signing import forgery, signed_vote  # noqa: E402
from tests.helpers.golden_runs import TINY_FP32  # noqa: E402
from tests.helpers.tiny_training import SEED, train_swarm  # noqa: E402

WARMUP_STEPS = 5
REPEATS = 200


def vote_costs_ms(folder: Path) -> tuple[float, float]:
    """Milliseconds to sign one vote and to verify one (a member signs its own and verifies the others' each step)."""
    key = load_identity(folder / "timing.key")
    started = time.perf_counter()
    votes = [signed_vote(key, namespace="timing", step=step, attempt=0, ok=True) for step in range(REPEATS)]
    signed = time.perf_counter()
    assert all(forgery(vote, namespace="timing", step=step, attempt=0) is None for step, vote in enumerate(votes))
    verified = time.perf_counter()
    return 1e3 * (signed - started) / REPEATS, 1e3 * (verified - signed) / REPEATS


def steps_per_min(results: list[dict]) -> float:
    """60 over the median, across steps past the warm-up, of the slowest peer's wall time of that step."""
    steps = len(results[0]["reports"])
    slowest = [max(result["reports"][step]["wall_s"] for result in results) for step in range(WARMUP_STEPS, steps)]
    return 60.0 / statistics.median(slowest)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    measured: dict[bool, list[float]] = {False: [], True: []}
    with tempfile.TemporaryDirectory() as folder:
        for round_ in range(args.rounds):
            for unchecked in ((False, True) if round_ % 2 == 0 else (True, False)):
                run = Path(folder) / f"round{round_}-{'unchecked' if unchecked else 'checked'}"
                run.mkdir()
                results = train_swarm(run, swarm=f"checkcost{round_}{int(unchecked)}", steps=args.steps,
                                      model=TINY_FP32, seed=SEED, unchecked=unchecked, timeout_s=600)
                measured[unchecked].append(steps_per_min(results))
                print(f"round {round_}, {'without' if unchecked else 'with'} checks: "
                      f"{measured[unchecked][-1]:.0f} steps/min", flush=True)
        sign_ms, verify_ms = vote_costs_ms(Path(folder))
    checked, unchecked = statistics.median(measured[False]), statistics.median(measured[True])
    step_ms = 60e3 / checked
    ratios = [b / a for a, b in zip(measured[False], measured[True])]
    paired = statistics.median(ratios)
    verdict = ("they straddle 1, so whatever the checks cost is below what this machine resolves"
               if min(ratios) <= 1 <= max(ratios)
               else f"the checks cost about {100 * (1 - 1 / paired):.0f} % of the rate")
    rows = "\n".join(f"| {round_} | {a:.0f} | {b:.0f} | {ratio:.2f} |" for round_, (a, b, ratio) in
                     enumerate(zip(measured[False], measured[True], ratios)))
    votes_ms = sign_ms + 3 * verify_ms
    summary = textwrap.fill(
        f"Median: **{checked:.0f} steps/min with the checks, {unchecked:.0f} without**; the rounds' paired ratios run "
        f"from {min(ratios):.2f} to {max(ratios):.2f} (median {paired:.2f}): {verdict}. The votes' part, timed in "
        f"this process: signing one vote takes {sign_ms:.2f} ms and verifying one {verify_ms:.3f} ms, so a member's "
        f"own vote and the 3 others' take {votes_ms:.2f} ms of a {step_ms:.0f} ms step "
        f"({100 * votes_ms / step_ms:.1f} %); the average and part checks are a norm per part, on tensors the "
        f"all-reduce already walks; the audits add, per step and member, a signed statement per reducer and one "
        f"request per other reducer and other sender for one part, made as soon as that part's average is here "
        f"(client/training/reduction_audit.py).",
        width=117)
    markdown = f"""## Checks against hostile members: what they cost a fault-free run

Command: `{command_line()}` on the project's 2-core machine (CPU, 4 training processes).

A 2 × 2 swarm of the tiny model (fp32 on the wire), {args.steps} steps per run, alternately with the checks against
hostile members (every average and gradient part checked, votes signed and verified, parts signed and every
reducer audited on one part) and without them; steps per minute from the slowest peer's median step time past the
first {WARMUP_STEPS} steps.

| round | with checks (steps/min) | without (steps/min) | without / with |
|---|---|---|---|
{rows}

{summary}
"""
    print(markdown)
    write_section("check-cost", markdown)


if __name__ == "__main__":
    main()
