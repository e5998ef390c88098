"""Shared test helpers: real DHT nodes and P2P daemons on 127.0.0.1, record factories, scheduler oracles."""
