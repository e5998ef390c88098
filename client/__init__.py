"""The volunteer's side of hetswarm, and the `hetswarm` command.

Joining and measuring
 * node.py                - NodeConfig, Identity, SwarmNode: the DHT process and its P2P replica
 * addresses.py           - multiaddrs from the user, checked with py-multiaddr
 * hardware.py            - GPU/CPU matmul TFLOPS (cached) and memory
 * link_probe.py          - RTT and bandwidth to a peer over P2P
 * emulation.py           - EmulatedP2P: links paced and delayed as a real-world scenario says
 * volunteer.py           - heartbeat, swarm view and probing loops of a joined peer
 * assignment_follower.py - accepts only the pinned coordinator's assignments
Training
 * model.py               - GPT stages (nanoGPT-style), built for a layer range from a seed
 * data.py                - byte-level tokens; a default corpus that needs no download
 * reference.py           - the single-process step that a distributed step must equal
 * stage_links.py         - activations and gradients between pipeline neighbours
 * group_allreduce.py     - a stage group's gradient all-reduce (hivemind AllReduceRunner)
 * stage_worker.py        - one stage's GPipe step, composed from the pieces above
 * stage_errors.py        - StageError and its kinds: refused frame, silent neighbour, partial all-reduce
 * trainer.py             - follows assignments: (re)starts the stage worker, publishes progress
Processes and the command line
 * process.py             - signals that leave cleanly; DHT start that Ctrl+C does not reach
 * join.py                - the join, bootstrap and monitor processes
 * coordinator_process.py - the coordinator process
 * local_swarm.py         - a whole swarm of `hetswarm` processes on 127.0.0.1, always reaped
 * monitor.py             - the swarm snapshot (JSON) and its rich tables
 * demo.py                - `hetswarm demo`: a swarm that measures, schedules, trains and compares plans
 * cli.py, cli_options.py, schedule_cli.py, coordinator_cli.py, demo_cli.py - the typer app and its commands
"""
