"""One RSA key per peer: it is the libp2p identity (so it fixes the peer id) and it signs the peer's records.

Identity files are read in client/peer/hivemind_compat/identity.py (hivemind's key class has no public way in).
"""
from __future__ import annotations

import functools
import hashlib

import base58
import multihash
from cryptography.hazmat.primitives import serialization
from hivemind.proto import crypto_pb2
from hivemind.utils.crypto import RSAPublicKey


def peer_id_of(public_key: RSAPublicKey) -> str:
    """The libp2p peer id (base58) of an RSA public key: sha2-256 multihash of its protobuf encoding."""
    return _peer_id_of_openssh(public_key.to_bytes())


@functools.lru_cache(maxsize=4096)
def _peer_id_of_openssh(key: bytes) -> str:
    """`peer_id_of` from the key's OpenSSH encoding (hivemind's public form of it); records repeat keys, hence the
    cache."""
    der = serialization.load_ssh_public_key(key).public_bytes(
        encoding=serialization.Encoding.DER, format=serialization.PublicFormat.SubjectPublicKeyInfo
    )
    encoded = crypto_pb2.PublicKey(key_type=crypto_pb2.RSA, data=der).SerializeToString()
    digest = multihash.encode(hashlib.sha256(encoded).digest(), multihash.coerce_code("sha2-256"))
    return base58.b58encode(digest).decode()
