"""The `hetswarm` command: thin typer commands that parse options, build configs and hand over to the rooms below.

 * app.py         - the full typer app: join / bootstrap / monitor / token, and the commands of the modules below
 * options.py     - options shared by several commands, the logging set-up, `run` (one way out for expected errors)
 * schedule.py    - `hetswarm schedule`: plan a network without any GPU
 * coordinator.py - `hetswarm coordinator`
 * demo.py        - `hetswarm demo`
 * doctor.py      - `hetswarm doctor`: one verdict per check of this peer's set-up and its swarm
 * export.py      - `hetswarm export`: checkpoints to a Hugging Face model folder
 * generate.py    - `hetswarm generate`: sample from an exported folder
 * data.py        - `hetswarm data prepare`: documents to token files with an index and a digest
 * processes.py   - the processes behind the long-running commands: start-up order, signals, clean exits
 * plots.py       - the demo's PNG (loss curves, measured vs predicted step time); matplotlib is optional

Nothing outside this room imports it, but for the tests' one door into a process (`TEST_PLUGIN_ENV`).
"""
import sys

from hetswarm.client.cli.options import run
from hetswarm.client.peer.process_env import prepare_process_environment

__all__ = ["TEST_PLUGIN_ENV", "main"]

TEST_PLUGIN_ENV = "HETSWARM_TEST_PLUGIN"
"""The one door for tests into a `hetswarm` process they start (tests/helpers/process_faults.py): ``module:function``,
called before a command of the full app runs. Unset (always, outside tests), nothing happens."""


def main() -> None:
    """`hetswarm`: `schedule` runs on an app of its own that loads neither torch nor hivemind (it starts at once);
    every other command loads the full app."""
    prepare_process_environment()
    if sys.argv[1:2] == ["schedule"]:
        from hetswarm.client.cli.schedule import schedule_app

        run(schedule_app, args=sys.argv[2:], prog_name="hetswarm schedule")
    else:
        from hetswarm.client.cli.app import main as run_full_app

        run_full_app()
