"""A swarm of real `hetswarm` processes on one machine (127.0.0.1), for the demo, the tests and the benchmarks.

 * swarm.py       - LocalSwarm: starts bootstrap, client and coordinator processes, watches them, reaps them by PID
 * preimported.py - those processes forked from a server that imported torch and hivemind once (for the tests)
 * demo.py        - DemoConfig and run_swarm: measure, schedule and train one plan after another, measured and predicted
"""
from hetswarm.client.local.demo import DemoConfig, DemoWatch, PhaseResult, run_swarm
from hetswarm.client.local.swarm import LocalSwarm, hetswarm_command

__all__ = ["DemoConfig", "DemoWatch", "LocalSwarm", "PhaseResult", "hetswarm_command", "run_swarm"]
