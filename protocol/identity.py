"""One RSA key per peer: it is the libp2p identity (so it fixes the peer id) and it signs the peer's records."""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

import base58
import multihash
from cryptography.hazmat.primitives import serialization
from hivemind.p2p import P2P
from hivemind.proto import crypto_pb2
from hivemind.utils.crypto import RSAPrivateKey, RSAPublicKey

from hetswarm.protocol.errors import RejectedInput


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


def peer_id_of(public_key: RSAPublicKey) -> str:
    """The libp2p peer id (base58) of an RSA public key: sha2-256 multihash of its protobuf encoding."""
    der = public_key._public_key.public_bytes(
        encoding=serialization.Encoding.DER, format=serialization.PublicFormat.SubjectPublicKeyInfo
    )
    encoded = crypto_pb2.PublicKey(key_type=crypto_pb2.RSA, data=der).SerializeToString()
    digest = multihash.encode(hashlib.sha256(encoded).digest(), multihash.coerce_code("sha2-256"))
    return base58.b58encode(digest).decode()
