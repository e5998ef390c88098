"""A libp2p identity file as hivemind 1.1.12's `RSAPrivateKey`, the key that both fixes a peer id and signs.

`RSAPrivateKey()` always generates a new key, and its only way in from bytes is unpickling; the identity file holds
the key p2pd uses (a protobuf `PrivateKey` around DER), so the loaded key is put where the class keeps its own
(`_private_key`).
"""
from __future__ import annotations

import os
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from hivemind.p2p import P2P
from hivemind.proto import crypto_pb2
from hivemind.utils.crypto import RSAPrivateKey

from hetswarm.protocol.errors import RejectedInput

__all__ = ["load_identity"]


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
