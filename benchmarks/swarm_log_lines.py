"""What a local swarm's logs say about a run, for the scale benchmarks (demo_scale.py, swarm_scale.py)."""
from __future__ import annotations

import collections
import re
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

_LEVELS = "DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL"
_ESTIMATED = re.compile(rf"priced on (\d+) estimated links, ([^\n]*(?:\n {{20,}}(?!(?:{_LEVELS})\b)\S[^\n]*)*)")
"""A long line goes on, indented, on the next lines of the log; a new record there names its level first."""


def departures_counted(coordinator_log: str) -> str:
    """Whether the coordinator ever counted peers as left: "never", or the counts it logged."""
    left = re.findall(r"membership changed[^\n]*?(\d+) left", coordinator_log)
    return "yes: " + ", ".join(left) if any(int(n) for n in left) else "never"


def planned_out(coordinator_log: str) -> list[str]:
    """The peers the coordinator left out as unreachable, as their members reported them."""
    return re.findall(r"Leaving (\S+) out and re-planning", coordinator_log)


def unstored_records(logs: Path) -> str:
    """Log lines of clients whose record no DHT node accepted, in all and by the reason of the store
    (client/peer/volunteer.py: start, heartbeat, probe, assignment, leaving)."""
    reasons = collections.Counter(reason for log in logs.glob("*.log") for reason in re.findall(
        r"No DHT node accepted our peer record \((\w+)\)", log.read_text(errors="replace")))
    each = ", ".join(f"{reason} {count}" for reason, count in reasons.most_common())
    return f"{reasons.total()} ({each})" if reasons else "0"


_RICH_STAMP = re.compile(r"\[(\d\d/\d\d/\d\d \d\d:\d\d:\d\d)\]")
"""How the CLI's log (rich) stamps a line; a line logged in the same second as the one above it has no stamp."""


def _stamped_lines(log: str) -> Iterator[tuple[float, str]]:
    """Each line of a CLI log with the time (epoch seconds, to the second) of the last stamp at or above it."""
    stamp = float("nan")
    for line in log.splitlines():
        if found := _RICH_STAMP.match(line):
            stamp = datetime.strptime(found.group(1), "%m/%d/%y %H:%M:%S").timestamp()
        yield stamp, line


def coordinator_phases(coordinator_log: str, peers: int, since: float) -> dict[str, float | None]:
    """Seconds from `since` (epoch) to the coordinator's steps towards its first plan, as it logged them: its last
    read of fewer than `peers` trainable peers, the end of its first search, its request to measure estimated links
    (coordinator/measurement_wait.py) and its first plan's publication; None for a step it did not log."""
    patterns = {"last read short of every peer": f"Waiting for {peers} trainable peers",
                "first search done": "search: ", "estimated links asked for": "estimated links; their peers measure",
                "first plan published": "Publishing v"}
    found: dict[str, float | None] = dict.fromkeys(patterns)
    for stamp, line in _stamped_lines(coordinator_log):
        for phase, pattern in patterns.items():
            if pattern in line and (found[phase] is None or phase == "last read short of every peer"):
                found[phase] = stamp - since
        if found["first plan published"] is not None:
            break
    return found


def estimated_links(coordinator_log: str) -> str:
    """The estimated links the coordinator priced a plan on, with the estimator's error, as it logged them."""
    found = _ESTIMATED.search(coordinator_log)
    return f"{found.group(1)}, {' '.join(found.group(2).split())}" if found else "none"
