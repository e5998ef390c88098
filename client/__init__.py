"""The peer's side of hetswarm, in four rooms by job (as Petals splits cli/, server/ and client/):

 * peer/     - what any peer runs: node, addresses, hardware and link probes, emulation, the volunteer's loops,
               the assignment follower, and the typed swarm snapshot
 * training/ - the pipeline runtime: model, data, neighbour streams, group all-reduce, stage worker, trainer
 * local/    - a swarm of hetswarm processes on one machine (the demo, tests and benchmarks use it)
 * cli/      - the `hetswarm` command: thin typer commands, process wiring and rendering; nothing imports it

Imports run one way: cli → local, training → peer → hetswarm.coordinator → hetswarm.protocol.
"""
