"""What any peer of a swarm runs, whatever its role: its node, what it measures and publishes, the plan it follows.

 * node.py                - NodeConfig, Identity, SwarmNode: the DHT process and its P2P replica; start_dht
 * addresses.py           - multiaddrs from the user, checked with py-multiaddr; the default listen and
                            metrics addresses
 * hardware.py            - GPU/CPU matmul TFLOPS (cached) and memory
 * link_probe.py          - RTT and bandwidth to a peer over P2P, and what the plan's frames show of a link
 * emulation.py           - EmulatedP2P: links paced and delayed as a real-world scenario says
 * volunteer.py           - heartbeat, swarm view and probing loops of a joined peer
 * link_prober.py         - which links this peer measures and when: its half of the pairs, stalest first, backoff
 * assignment_follower.py - accepts only the pinned coordinator's assignments, checked once on arrival
 * reachability.py        - can peers dial this one back? (asked on join, answered for others; the doctor's clock)
 * metrics.py             - Prometheus collectors read from the live objects at scrape time (--metrics-port)
 * peer_gate.py           - per-peer limits on a handler (streams at once, calls per second, who)
 * served.py              - Served: a plan's handlers attached to the P2P while the plan runs, detached after
 * process_env.py         - what a process sets before hivemind is imported (torch's tensor-sharing strategy)
 * hivemind_compat/       - the one room that reaches into hivemind 1.1.12's internals (version-checked): p2pd
                            client repair and dial, stream message bound, DHT command pipe, identity files, the
                            all-reduce runner's hooks

The package imports none of them: a command that needs only a light one (`hetswarm schedule` reads options that
name addresses) does not start hivemind or torch.
"""
