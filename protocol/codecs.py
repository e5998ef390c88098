"""Tensors in a wire codec (protocol/wire_format.py), with hivemind's serializers and quantizers.

``fp32`` and ``fp16`` travel uncompressed (``CompressionType.NONE``) in that dtype, so a receiver can check the bytes
against the shape exactly. ``8bit`` is hivemind's uniform 8-bit quantization (``UNIFORM_8BIT``, its buckets and its
format) written here: hivemind 1.1.12's divides by zero on tensors whose values are all equal, calls torch's
deprecated quantized tensors, and cannot decode under NumPy 2 (docs/hivemind.md, pitfall 16). Error bounds, which
tests/test_codecs.py holds them to:

 * fp32: none;
 * fp16: |x - x̂| ≤ 2^-11·|x| for |x| in fp16's normal range (2^-14 to 65504); larger values saturate;
 * 8bit: 256 buckets of width 6σ/256 centred on the tensor's mean μ (σ its standard deviation), each sent as the mean
   of its values: |x - x̂| ≤ 6σ/256 for x within 2.95σ of μ (the inner 254 buckets); the two edge buckets also take
   every value beyond, so there x̂ is the mean of the values in the edge bucket.
"""
import math

import numpy as np
import torch
from hivemind.compression import (
    CompressionBase,
    CompressionInfo,
    Float16Compression,
    NoCompression,
    deserialize_torch_tensor,
    serialize_torch_tensor,
)
from hivemind.compression.quantization import Uniform8BitQuantization, average_buckets
from hivemind.proto import runtime_pb2

from hetswarm.protocol.wire_format import BYTES_PER_VALUE, CODEBOOK_BYTES, Codec

__all__ = ["COMPRESSION_TYPES", "Uniform8Bit", "allreduce_compression", "decode_tensor", "encode_tensor",
           "round_trip", "wire_bytes", "wire_dtype"]

_DTYPES: dict[Codec, torch.dtype] = {"fp32": torch.float32, "fp16": torch.float16, "8bit": torch.float32}
COMPRESSION_TYPES: dict[Codec, int] = {"fp32": runtime_pb2.CompressionType.NONE,
                                       "fp16": runtime_pb2.CompressionType.NONE,
                                       "8bit": runtime_pb2.CompressionType.UNIFORM_8BIT}
_MIN_SCALE = 1e-30
"""The bucket width of a tensor with no spread: every value lands in the middle bucket, sent exactly."""


class Uniform8Bit(Uniform8BitQuantization):
    """hivemind's ``Uniform8BitQuantization`` (same buckets, same format), defined for every tensor."""

    def quantize(self, tensor: torch.Tensor, allow_inplace: bool = False) -> tuple[np.ndarray, np.ndarray]:
        values = tensor.detach().to(torch.float32)
        centered = values - values.mean() if values.numel() else values
        spread = float(centered.norm()) / math.sqrt(max(values.numel() - 1, 1))
        scale = max(self.RANGE_IN_SIGMAS * spread / self.n_bins, _MIN_SCALE)
        middle = self.n_bins // 2
        quantized = torch.clamp(torch.round(centered / scale) + middle, 0, self.n_bins - 1).to(torch.uint8)
        lookup = average_buckets(values, quantized, self.n_bins)
        return quantized.numpy(), lookup.numpy().astype(self.codebook_dtype)

    def extract(self, serialized_tensor: runtime_pb2.Tensor) -> torch.Tensor:
        buffer = serialized_tensor.buffer
        codebook_size = int(np.frombuffer(buffer, count=1, dtype=np.int64)[0])
        codebook = np.frombuffer(buffer, offset=8, count=codebook_size, dtype=self.codebook_dtype)
        indices = np.frombuffer(buffer, offset=8 + codebook.nbytes, dtype=self.indices_dtype)
        values = torch.from_numpy(codebook.copy())[torch.from_numpy(indices.astype(np.int64))]
        return values.reshape(tuple(serialized_tensor.size)).to(getattr(torch, serialized_tensor.dtype))


_UNIFORM_8BIT = Uniform8Bit()


def wire_dtype(codec: Codec) -> torch.dtype:
    """The dtype a tensor sent in `codec` decodes to."""
    return _DTYPES[codec]


def wire_bytes(codec: Codec, numel: int) -> int:
    """Exactly how many tensor bytes `numel` values take in `codec`."""
    return numel * BYTES_PER_VALUE[codec] + (CODEBOOK_BYTES if codec == "8bit" else 0)


def encode_tensor(tensor: torch.Tensor, codec: Codec) -> runtime_pb2.Tensor:
    """`tensor` (on any device) serialized in `codec`."""
    tensor = tensor.detach().cpu()  # hivemind serializes CPU tensors only
    if codec == "8bit":
        return _UNIFORM_8BIT.compress(tensor.to(torch.float32), CompressionInfo.from_tensor(tensor))
    return serialize_torch_tensor(tensor.to(_DTYPES[codec]))


def decode_tensor(serialized: runtime_pb2.Tensor) -> torch.Tensor:
    """The CPU tensor a message carries (its dtype is `wire_dtype` of its codec)."""
    if serialized.compression == _UNIFORM_8BIT.compression_type:
        return _UNIFORM_8BIT.extract(serialized)
    return deserialize_torch_tensor(serialized)


def round_trip(tensor: torch.Tensor, codec: Codec) -> torch.Tensor:
    """What a receiver gets for `tensor`: its values after encoding and decoding, as float32."""
    return decode_tensor(encode_tensor(tensor, codec)).to(torch.float32)


def allreduce_compression(codec: Codec) -> CompressionBase:
    """The hivemind compression an all-reduce sends its parts with in `codec` (fp16: hivemind's cast to half)."""
    return {"fp32": NoCompression(), "fp16": Float16Compression(), "8bit": _UNIFORM_8BIT}[codec]
