"""The one room where hetswarm reaches past hivemind's public API, pinned to the hivemind release it was read from.

Each module names the hivemind 1.1.12 internals it relies on, and why the public API does not do: the p2pd control
client (`control`: late answers, a dial), the stream reader (`streams`: the message bound), the DHT process's command
pipe (`dht_process`), the RSA key wrapper and the identity check's daemon (`identity`), and the all-reduce runner's
private steps (`allreduce`).
Nothing else in hetswarm names a private hivemind attribute or imports a private hivemind module
(tests/test_import_doors.py); a new hivemind release is checked here, once, before this room is trusted with it.
"""
from __future__ import annotations

import hivemind

HIVEMIND_VERSION = "1.1.12"
"""The release whose internals this room was written against (pyproject.toml pins it)."""

if hivemind.__version__ != HIVEMIND_VERSION:
    raise ImportError(f"hetswarm needs hivemind {HIVEMIND_VERSION}, found {hivemind.__version__}: "
                      f"client/peer/hivemind_compat/ reaches into its internals; read it against the new release "
                      f"before changing the pin (pip install hivemind=={HIVEMIND_VERSION})")

from hetswarm.client.peer.hivemind_compat.allreduce import HookedAllReduceRunner
from hetswarm.client.peer.hivemind_compat.control import (
    ControlFailure,
    P2PDaemonError,
    dial,
    settle_late_answers,
)
from hetswarm.client.peer.hivemind_compat.dht_process import read_commands_whole, shut_down_from_inside
from hetswarm.client.peer.hivemind_compat.identity import load_identity, patient_identity_check
from hetswarm.client.peer.hivemind_compat.streams import (
    MessageTooLarge,
    bound_stream_messages,
    unbound_stream_messages,
)

__all__ = ["HIVEMIND_VERSION", "ControlFailure", "HookedAllReduceRunner", "MessageTooLarge", "P2PDaemonError",
           "bound_stream_messages", "dial", "load_identity", "patient_identity_check", "read_commands_whole",
           "settle_late_answers",
           "shut_down_from_inside", "unbound_stream_messages"]
