"""The `hetswarm` command: thin typer commands that parse options, build configs and hand over to the rooms below.

 * app.py         - the typer app, `main` (one way out for expected errors), join / bootstrap / monitor
 * options.py     - options shared by several commands, and the logging set-up
 * schedule.py    - `hetswarm schedule`: plan a network without any GPU
 * coordinator.py - `hetswarm coordinator`
 * demo.py        - `hetswarm demo`
 * doctor.py      - `hetswarm doctor`: one verdict per check of this peer's set-up and its swarm
 * web.py         - `monitor --web`: the live page and /api/v1/state (aiohttp; static/ holds its HTML, JS, CSS)
 * processes.py   - the processes behind the long-running commands: start-up order, signals, clean exits
 * render.py      - everything drawn for people: the monitor's tables, the demo's live view and summary
 * plots.py       - the demo's PNG (loss curves, measured vs predicted step time); matplotlib is optional

Nothing outside this room imports it.
"""
from hetswarm.client.cli.app import app, main

__all__ = ["app", "main"]
