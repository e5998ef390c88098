"""hivemind checks that a joining peer's identity is free with a second p2p daemon, given hivemind's 15 s to start
unless hetswarm's patience is installed (client/peer/hivemind_compat/identity.py); the check still tells a taken
identity from a free one, on two real DHT nodes."""
from __future__ import annotations

import asyncio

import pytest
from hivemind.p2p import P2P

from hetswarm.client.peer.hivemind_compat import load_identity, patient_identity_check
from tests.helpers.dht_nodes import dht_pair

pytestmark = [pytest.mark.swarm, pytest.mark.timeout(120)]


def test_the_identity_check_gives_its_daemon_the_peers_time_to_start_and_still_finds_a_taken_identity(
        tmp_path, monkeypatch):
    with dht_pair("identity", tmp_path) as ((first, _), _):
        maddrs = [str(m) for m in first.get_visible_maddrs()]
        load_identity(tmp_path / "free.key")
        started_with, create = [], P2P.create.__func__

        async def recording_create(cls, *args, **kwargs):
            started_with.append(kwargs.get("startup_timeout"))
            return await create(cls, *args, **kwargs)

        monkeypatch.setattr(P2P, "create", classmethod(recording_create))
        patient_identity_check(41.0)

        async def check(name: str) -> bool:
            return await P2P.is_identity_taken(str(tmp_path / name), initial_peers=maddrs, tls=True,
                                               use_auto_relay=False, use_ipfs=False, use_relay=True)

        taken, free = asyncio.run(check("a.key")), asyncio.run(check("free.key"))
    assert (taken, free) == (True, False)
    assert started_with == [41.0, 41.0]
