"""An answer from p2pd to a call whose caller was just cancelled leaves hivemind's control client working once
hetswarm's repair is installed, and ends its reading task without it (client/peer/hivemind_compat/control.py).

The race is played deterministically on the client's real reading loop, fed by hand: the daemon's answer is in the
reader's buffer when the caller is cancelled, so the loop reads it before the caller drops its call.
"""
from __future__ import annotations

import asyncio
import importlib

import pytest
from hivemind.p2p import PeerID
from hivemind.p2p.p2p_daemon_bindings.control import ControlClient
from hivemind.proto import p2pd_pb2

from hetswarm.client.peer.hivemind_compat import settle_late_answers


def _framed(response: p2pd_pb2.PersistentConnectionResponse) -> bytes:
    """A message as p2pd writes it on the persistent connection: its length as an unsigned varint, then itself."""
    body, length, prefix = response.SerializeToString(), len(response.SerializeToString()), bytearray()
    while True:
        byte, length = length & 0x7F, length >> 7
        prefix.append(byte | (0x80 if length else 0))
        if not length:
            return bytes(prefix) + body


def _answer(call_id: bytes, data: bytes) -> bytes:
    return _framed(p2pd_pb2.PersistentConnectionResponse(
        callId=call_id, callUnaryResponse=p2pd_pb2.CallUnaryResponse(response=data)))


def _next_call_id(control: ControlClient) -> bytes:
    """The id of the next unary call the client queued for p2pd (past the cancellations it queued)."""
    while not (request := control._pending_messages.get_nowait()).HasField("callUnary"):
        pass
    return request.callId


async def _late_answer_then_another_call(repaired: bool) -> tuple[bool, bytes | None]:
    """Whether the reading task survived an answer to a cancelled call, and the answer a later call then got."""
    settle_late_answers()
    control = ControlClient(daemon_connector=None, _initialized_with_create=True)
    if not repaired:
        control._pending_calls = dict(control._pending_calls)  # hivemind's own: a plain dict of futures
    reader = asyncio.StreamReader()
    reading = asyncio.create_task(control._read_from_persistent_conn(reader))
    peer = PeerID(b"\x00\x24" + bytes(36))

    cancelled = asyncio.create_task(control.call_unary_handler(peer, "/test", b"first"))
    await asyncio.sleep(0)  # its request is queued, and it waits for the answer
    reader.feed_data(_answer(_next_call_id(control), b"too late"))  # the answer is in: the reading loop runs next
    cancelled.cancel()  # (a timeout) its future is cancelled now; it drops the call only when it runs again
    await asyncio.gather(cancelled, return_exceptions=True)
    await asyncio.sleep(0.05)

    later = asyncio.create_task(control.call_unary_handler(peer, "/test", b"second"))
    await asyncio.sleep(0)
    reader.feed_data(_answer(_next_call_id(control), b"on time"))
    try:
        async with asyncio.timeout(1.0):
            got = await later
    except TimeoutError:  # nobody reads the daemon's answers any more: every call waits for ever
        got = None
    alive = not reading.done()
    reading.cancel()
    await asyncio.gather(reading, return_exceptions=True)
    return alive, got


@pytest.mark.parametrize("repaired", [True, False], ids=["repaired", "hivemind-1.1.12"])
def test_an_answer_to_a_cancelled_call_is_dropped_and_later_calls_are_answered(repaired: bool):
    alive, got = asyncio.run(_late_answer_then_another_call(repaired))
    if repaired:
        assert alive and got == b"on time"
    else:  # the bug the repair is for: the reading task is gone, and the next call is never answered
        assert not alive and got is None


def test_another_hivemind_release_is_refused_at_import_naming_the_room(monkeypatch):
    """The room was read against one hivemind release: under another, importing it fails and says where to look."""
    import hivemind

    from hetswarm.client.peer import hivemind_compat

    monkeypatch.setattr(hivemind, "__version__", "1.2.0")
    with pytest.raises(ImportError, match=r"needs hivemind 1\.1\.12, found 1\.2\.0: client/peer/hivemind_compat/"):
        importlib.reload(hivemind_compat)
    monkeypatch.undo()
    importlib.reload(hivemind_compat)  # as it was, for the other tests of this process
