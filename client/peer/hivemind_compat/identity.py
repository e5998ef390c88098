"""A libp2p identity file as hivemind 1.1.12's `RSAPrivateKey`, the key that both fixes a peer id and signs.

`RSAPrivateKey()` always generates a new key, and its only way in from bytes is unpickling; the identity file holds
the key p2pd uses (a protobuf `PrivateKey` around DER), so the loaded key is put where the class keeps its own
(`_private_key`).

`patient_identity_check` gives the second daemon that hivemind starts to check that an identity is free
(`P2P.is_identity_taken`, with `P2P.create`'s default 15 s to start) the same time to start as a peer's own.
"""
from __future__ import annotations

import os
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from hivemind.p2p import P2P
from hivemind.proto import crypto_pb2
from hivemind.utils.crypto import RSAPrivateKey

from hetswarm.protocol.errors import RejectedInput

__all__ = ["load_identity", "patient_identity_check"]


_IS_IDENTITY_TAKEN = P2P.is_identity_taken.__func__
"""hivemind's own check, which creates its daemon with `cls.create`."""


class _PatientP2P(P2P):
    """A P2P whose daemon is given `startup_timeout_s` to start where its caller names no time."""

    startup_timeout_s = 15.0

    @classmethod
    async def create(cls, *args, **kwargs) -> P2P:
        kwargs.setdefault("startup_timeout", cls.startup_timeout_s)
        return await super().create(*args, **kwargs)


def patient_identity_check(startup_timeout_s: float) -> None:
    """Makes `P2P.is_identity_taken` start its daemon as `_PatientP2P` (module docstring): of 64 peers started on
    2 cores (benchmarks/swarm_scale.py), one gave up in that check's 15 s."""
    _PatientP2P.startup_timeout_s = startup_timeout_s
    P2P.is_identity_taken = classmethod(lambda cls, *args, **kwargs: _IS_IDENTITY_TAKEN(_PatientP2P, *args, **kwargs))


def load_identity(path: str | os.PathLike) -> RSAPrivateKey:
    """Reads the libp2p identity file at `path`, creating it (mode 0400) when missing."""
    path = Path(path)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        P2P.generate_identity(str(path))
    try:
        der = crypto_pb2.PrivateKey.FromString(path.read_bytes()).data
        key = serialization.load_der_private_key(der, password=None)
    except Exception as e:
        raise RejectedInput(f"{path} is not a libp2p RSA identity file: {e}") from None
    private_key = RSAPrivateKey.__new__(RSAPrivateKey)  # wraps the loaded key instead of generating a new one
    private_key._private_key = key
    return private_key
