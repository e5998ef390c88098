"""What a local swarm's logs say about a run, for the scale benchmarks (demo_scale.py, swarm_scale.py)."""
from __future__ import annotations

import re
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


def unstored_records(logs: Path) -> int:
    """Log lines of clients whose record no DHT node accepted."""
    return sum(log.read_text(errors="replace").count("No DHT node accepted our peer record")
               for log in logs.glob("*.log"))


def estimated_links(coordinator_log: str) -> str:
    """The estimated links the coordinator priced a plan on, with the estimator's error, as it logged them."""
    found = _ESTIMATED.search(coordinator_log)
    return f"{found.group(1)}, {' '.join(found.group(2).split())}" if found else "none"
