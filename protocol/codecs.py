"""Tensors in a wire codec (protocol/wire_format.py), as hivemind ``runtime_pb2.Tensor`` messages.

``fp32`` and ``fp16`` travel uncompressed (``CompressionType.NONE``) in that dtype, so a receiver can check the bytes
against the shape exactly (the all-reduce sends fp16 with hivemind's ``Float16Compression``). ``8bit`` is blockwise
absmax quantization (Dettmers et al. 2022, "8-bit Optimizers via Block-wise Quantization", the scheme of hivemind's
``BLOCKWISE_8BIT``, whose implementation needs bitsandbytes): each block of BLOCK_VALUES values is sent as its
largest magnitude m (float32) and one int8 per value, round(127·x/m). hivemind's other 8-bit quantizers do not work
here (docs/hivemind.md, pitfall 9), and their uniform buckets send every value beyond 3σ as its edge bucket's mean,
which turns one outlier in a gradient into a large error that error feedback then carries from step to step.

Error bounds, which tests/test_codecs.py holds them to:

 * fp32: none;
 * fp16: |x - x̂| ≤ 2^-11·|x| for |x| in fp16's normal range (2^-14 to 65504); larger values saturate;
 * 8bit: |x - x̂| ≤ m/254, m the largest magnitude in x's block; zeros stay zeros.

The 8-bit payload is hetswarm's own (scales, then int8 values) under the ``BLOCKWISE_8BIT`` label: only
``decode_tensor`` here reads it, never hivemind's deserializer.
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
from hivemind.proto import runtime_pb2

from hetswarm.protocol.wire_format import BLOCK_VALUES, Codec

__all__ = ["COMPRESSION_TYPES", "Blockwise8Bit", "allreduce_compression", "decode_tensor", "encode_tensor",
           "round_trip", "wire_bytes", "wire_dtype"]

_DTYPES: dict[Codec, torch.dtype] = {"fp32": torch.float32, "fp16": torch.float16, "8bit": torch.float32}
COMPRESSION_TYPES: dict[Codec, int] = {"fp32": runtime_pb2.CompressionType.NONE,
                                       "fp16": runtime_pb2.CompressionType.NONE,
                                       "8bit": runtime_pb2.CompressionType.BLOCKWISE_8BIT}
_LEVELS = 127


class Blockwise8Bit(CompressionBase):
    """Blockwise absmax int8 (module docstring), as a hivemind compression so that an all-reduce can send with it."""

    compression_type = runtime_pb2.CompressionType.BLOCKWISE_8BIT

    def compress(self, tensor: torch.Tensor, info: CompressionInfo, allow_inplace: bool = False) -> runtime_pb2.Tensor:
        values = tensor.detach().to("cpu", torch.float32).reshape(-1)
        blocks = _blocks(values.numel())
        padded = torch.nn.functional.pad(values, (0, blocks * BLOCK_VALUES - values.numel())).view(blocks, BLOCK_VALUES)
        scale = padded.abs().amax(dim=1) / _LEVELS  # (blocks,)
        quantized = torch.round(padded / torch.where(scale > 0, scale, 1.0)[:, None]).clamp_(-_LEVELS, _LEVELS)
        return runtime_pb2.Tensor(
            compression=self.compression_type, size=list(tensor.shape), dtype="float32",
            buffer=scale.numpy().tobytes() + quantized.to(torch.int8).view(-1)[: values.numel()].numpy().tobytes())

    def extract(self, serialized_tensor: runtime_pb2.Tensor) -> torch.Tensor:
        numel = math.prod(serialized_tensor.size)
        blocks = _blocks(numel)
        scale = np.frombuffer(serialized_tensor.buffer, dtype=np.float32, count=blocks)
        quantized = np.frombuffer(serialized_tensor.buffer, dtype=np.int8, offset=4 * blocks, count=numel)
        padded = np.zeros(blocks * BLOCK_VALUES, dtype=np.float32)
        padded[:numel] = quantized
        with np.errstate(invalid="ignore", over="ignore"):  # a hostile scale: the receiver refuses non-finite values
            values = (padded.reshape(blocks, BLOCK_VALUES) * scale[:, None]).reshape(-1)[:numel]
        return torch.from_numpy(values).reshape(tuple(serialized_tensor.size))

    def estimate_compression_ratio(self, info: CompressionInfo) -> float:
        return (1 + 4 / BLOCK_VALUES) / 4  # of float32, which is what an all-reduce sends


def _blocks(numel: int) -> int:
    return -(-numel // BLOCK_VALUES)


_BLOCKWISE_8BIT = Blockwise8Bit()


def wire_dtype(codec: Codec) -> torch.dtype:
    """The dtype a tensor sent in `codec` decodes to."""
    return _DTYPES[codec]


def wire_bytes(codec: Codec, numel: int) -> int:
    """Exactly how many tensor bytes `numel` values take in `codec`."""
    return {"fp32": 4 * numel, "fp16": 2 * numel, "8bit": numel + 4 * _blocks(numel)}[codec]


def encode_tensor(tensor: torch.Tensor, codec: Codec) -> runtime_pb2.Tensor:
    """`tensor` (on any device) serialized in `codec`."""
    tensor = tensor.detach().cpu()  # hivemind serializes CPU tensors only
    if codec == "8bit":
        return _BLOCKWISE_8BIT.compress(tensor, CompressionInfo.from_tensor(tensor))
    return serialize_torch_tensor(tensor.to(_DTYPES[codec]))


def decode_tensor(serialized: runtime_pb2.Tensor) -> torch.Tensor:
    """The CPU tensor a message carries (its dtype is `wire_dtype` of its codec)."""
    if serialized.compression == _BLOCKWISE_8BIT.compression_type:
        return _BLOCKWISE_8BIT.extract(serialized)
    return deserialize_torch_tensor(serialized)


def round_trip(tensor: torch.Tensor, codec: Codec) -> torch.Tensor:
    """What a receiver gets for `tensor`: its values after encoding and decoding, as float32."""
    return decode_tensor(encode_tensor(tensor, codec)).to(torch.float32)


def allreduce_compression(codec: Codec) -> CompressionBase:
    """The hivemind compression an all-reduce sends its parts with in `codec` (fp16: hivemind's cast to half)."""
    return {"fp32": NoCompression(), "fp16": Float16Compression(), "8bit": _BLOCKWISE_8BIT}[codec]
