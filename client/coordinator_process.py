"""The process behind `hetswarm coordinator`: a DHT peer that plans the swarm and publishes its assignments."""
from __future__ import annotations

import logging

from hetswarm.client.join import announce
from hetswarm.client.node import NodeConfig, identity_for, initial_peers_line
from hetswarm.client.process import run_until_signal, start_dht_for_process
from hetswarm.coordinator.broadcaster import BroadcastConfig, Broadcaster
from hetswarm.coordinator.planner import PlannerConfig, Replanner

logger = logging.getLogger(__name__)


def run_coordinator(node_config: NodeConfig, planner_config: PlannerConfig, broadcast_config: BroadcastConfig) -> None:
    """Starts the DHT node, prints what volunteers paste (and pin), and broadcasts until Ctrl+C."""
    identity = identity_for(node_config)
    dht = start_dht_for_process(node_config, identity)
    try:
        announce(f"Coordinator of swarm {node_config.swarm!r} is up. Volunteers join with:\n"
                 f"  hetswarm join {initial_peers_line(dht)} --swarm {node_config.swarm} "
                 f"--coordinator {identity.peer_id}\nCoordinator peer id: {identity.peer_id}")
        broadcaster = Broadcaster(dht, private_key=identity.private_key, coordinator_id=identity.peer_id,
                                  replanner=Replanner(planner_config), config=broadcast_config)
        run_until_signal(broadcaster.run)
        logger.info("Coordinator stopped")
    finally:
        dht.shutdown()
