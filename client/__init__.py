"""The peer's side of hetswarm, in five rooms by job (as Petals splits cli/, server/ and client/):

 * peer/     - what any peer runs: node, addresses, hardware and link probes, emulation, the volunteer's loops,
               the assignment follower; hivemind_compat/, the one room that reaches into hivemind's internals
 * training/ - the pipeline runtime: model, data, neighbour streams, group all-reduce, stage worker, trainer
 * monitor/  - what people see of a swarm: the typed snapshot, the terminal tables, the web page
 * local/    - a swarm of hetswarm processes on one machine (the demo, tests and benchmarks use it)
 * cli/      - the `hetswarm` command: thin typer commands and process wiring; nothing imports it

The doors (tests/test_import_doors.py): peer/ reaches, of hetswarm, only protocol and itself; training/ only
protocol, peer/ and itself; the coordinator (hetswarm.coordinator → hetswarm.protocol) is read only by monitor/,
local/ and cli/, which nothing below them imports.
"""
