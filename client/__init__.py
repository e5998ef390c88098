"""The volunteer's side of hetswarm.

 * cli.py          - the `hetswarm` typer app
 * cli_options.py  - options and consoles shared by commands
 * schedule_cli.py - `hetswarm schedule`: plan a stored or captured network without any GPU
"""
