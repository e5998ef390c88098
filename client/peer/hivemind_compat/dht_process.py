"""The command pipe between a hivemind 1.1.12 DHT process and the process that started it.

`hivemind.DHT` runs its node in a child process and sends it every command (`store`, `get`, `_shutdown`, ...) over
a private pipe (`_outer_pipe` in the parent, `_inner_pipe` in the child, hivemind/dht/dht.py). Two things need that
pipe and the API offers neither: reading each command whole (`read_commands_whole`; docs/hivemind.md, pitfall 1)
and, from inside the DHT process, asking it to shut down as its parent would (`shut_down_from_inside`; pitfall 5,
client/peer/node.py's OwnedDHT).
"""
from __future__ import annotations

import os

import hivemind

__all__ = ["read_commands_whole", "shut_down_from_inside"]


class WholeMessagePipe:
    """The DHT process's end of the command pipe from its parent, read one whole message at a time.

    hivemind's DHT loop watches this pipe with `loop.add_reader`, which (under uvloop, libuv's uv_poll_init) makes
    the descriptor non-blocking. `Connection.send` writes a message over 16 KiB as two writes, the length and then
    the body, so the loop can wake on the length alone; `recv` then reads part of the body, raises BlockingIOError,
    hivemind logs it and goes on with the rest of the body left in the pipe, and every later command is garbage:
    the node stops answering and the caller hangs (hivemind/dht/dht.py, `_run`). That is why storing a ~32 KB record
    killed a node (docs/hivemind.md, pitfall 1). Reading each message in blocking mode waits the microseconds the
    parent takes to write the body.
    """

    def __init__(self, connection) -> None:
        self._connection = connection

    def recv(self):
        descriptor = self._connection.fileno()
        was_blocking = os.get_blocking(descriptor)
        os.set_blocking(descriptor, True)
        try:
            return self._connection.recv()
        finally:
            os.set_blocking(descriptor, was_blocking)

    def __getattr__(self, name: str):
        return getattr(self._connection, name)


def read_commands_whole(dht: hivemind.DHT) -> None:
    """In the DHT process, before hivemind's `run`: its commands are read one whole message at a time."""
    dht._inner_pipe = WholeMessagePipe(dht._inner_pipe)


def shut_down_from_inside(dht: hivemind.DHT) -> None:
    """In the DHT process: sends it the command its parent's `shutdown()` sends (p2pd is then terminated and
    awaited); raises OSError or ValueError when the pipe is already closed."""
    dht._outer_pipe.send(("_shutdown", [], {}))
