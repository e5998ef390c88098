"""Tensors in a wire codec (protocol/wire_format.py), as hivemind ``runtime_pb2.Tensor`` messages.

``fp32`` and ``fp16`` travel uncompressed (``CompressionType.NONE``) in that dtype, so a receiver can check the bytes
against the shape exactly (the all-reduce sends fp16 with hivemind's ``Float16Compression``). ``8bit`` is blockwise
absmax quantization (Dettmers et al. 2022, "8-bit Optimizers via Block-wise Quantization", the scheme of hivemind's
``BLOCKWISE_8BIT``, whose implementation needs bitsandbytes): each block of BLOCK_VALUES values is sent as its
largest magnitude m (float32) and one int8 per value, round(127·x/m); ``4bit`` and ``2bit`` (activation
deltas) are the same with 7 and 1 levels each side of zero. hivemind's other 8-bit quantizers do not work
here (docs/hivemind.md, pitfall 9), and their uniform buckets send every value beyond 3σ as its edge bucket's mean,
which turns one outlier in a gradient into a large error that error feedback then carries from step to step.

Error bounds, which tests/test_codecs.py holds them to:

 * fp32: none;
 * fp16: |x - x̂| ≤ 2^-11·|x| for |x| in fp16's normal range (2^-14 to 65504); larger values saturate;
 * 8bit, 4bit, 2bit: |x - x̂| ≤ m/(2L), m the largest magnitude in x's block and L = 127, 7, 1 the levels each side
   of zero; zeros stay zeros;
 * the same rounded at random (a `rounding_seed`): x̂ is one of the two levels around x, the upper with a probability
   of x's distance from the lower, so |x - x̂| < m/L and x̂'s expectation is x (stochastic rounding: Gupta et al.
   2015, "Deep Learning with Limited Numerical Precision"). Rounding to the nearest of 7 levels sends every value
   below m/14 as zero, each time: the activation gradients of samples a model has nearly learned are such values,
   and a 4-bit backward that drops them stalls the end of training (protocol/wire_format.py, ROUNDED_AT_RANDOM).

The blockwise payloads are hetswarm's own (scales, then the levels: one int8 per value for 8bit, offset by L and
packed two or four to a byte for 4bit and 2bit) under the ``BLOCKWISE_8BIT`` label, the only blockwise type hivemind's
enum has: only ``decode_tensor`` here reads them, told apart by the codec the receiver expects (a frame header's, a
plan's all-reduce codec) and checked against their exact byte count.
"""
import math
import warnings

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

__all__ = ["COMPRESSION_TYPES", "BlockwiseQuantizer", "allreduce_compression", "decode_tensor", "encode_tensor",
           "round_trip", "wire_bytes", "wire_dtype_name"]

_BITS: dict[Codec, int] = {"8bit": 8, "4bit": 4, "2bit": 2}
_DTYPES: dict[Codec, torch.dtype] = {"fp32": torch.float32, "fp16": torch.float16} | dict.fromkeys(_BITS, torch.float32)
COMPRESSION_TYPES: dict[Codec, int] = {"fp32": runtime_pb2.CompressionType.NONE,
                                       "fp16": runtime_pb2.CompressionType.NONE} | dict.fromkeys(
    _BITS, runtime_pb2.CompressionType.BLOCKWISE_8BIT)


class BlockwiseQuantizer(CompressionBase):
    """Blockwise absmax quantization to `bits` bits (module docstring), as a hivemind compression so that an
    all-reduce can send with it."""

    compression_type = runtime_pb2.CompressionType.BLOCKWISE_8BIT

    def __init__(self, bits: int) -> None:
        self.bits, self.levels = bits, 2 ** (bits - 1) - 1
        self.per_byte = 8 // bits

    def compress(self, tensor: torch.Tensor, info: CompressionInfo, allow_inplace: bool = False) -> runtime_pb2.Tensor:
        return self.quantize(tensor)

    def quantize(self, tensor: torch.Tensor, *, rounding_seed: int | None = None) -> runtime_pb2.Tensor:
        """Quantized on the tensor's own device, so a GPU stage copies its levels to the host, not its floats; each
        value to its nearest level, or with `rounding_seed` to one of its two nearest at random (module docstring)."""
        values = tensor.detach().reshape(-1).to(torch.float32)
        blocks = _blocks(values.numel())
        padded = torch.nn.functional.pad(values, (0, blocks * BLOCK_VALUES - values.numel())).view(blocks, BLOCK_VALUES)
        largest = padded.abs().amax(dim=1)  # (blocks,)
        # divided by a tensor: CUDA divides by a scalar as a product with its reciprocal, which can round differently
        # from the CPU's quotient, and every device must send the same bytes for the same values
        scale = largest / torch.full_like(largest, self.levels)
        scaled = padded / torch.where(scale > 0, scale, 1.0)[:, None]
        if rounding_seed is None:
            quantized = torch.round(scaled)
        else:  # up with a probability of the distance from the level below: what the receiver gets averages to x
            generator = torch.Generator(scaled.device).manual_seed(rounding_seed)
            quantized = torch.floor(scaled + torch.rand(scaled.shape, generator=generator, device=scaled.device))
        quantized.clamp_(-self.levels, self.levels)
        levels = self._pack(quantized.view(-1)[: values.numel()])
        payload = torch.cat([scale.view(torch.uint8), levels.view(torch.uint8)])  # one copy to the host
        return runtime_pb2.Tensor(compression=self.compression_type, size=list(tensor.shape), dtype="float32",
                                 buffer=_host(payload).numpy().tobytes())

    def _pack(self, quantized: torch.Tensor) -> torch.Tensor:
        """The levels as bytes: int8 for 8 bits; else offset by L to 0 .. 2L and packed `per_byte` to a byte, the
        first value in the lowest bits."""
        if self.bits == 8:
            return quantized.to(torch.int8)
        offset = (quantized + self.levels).to(torch.uint8)
        offset = torch.nn.functional.pad(offset, (0, -offset.numel() % self.per_byte)).view(-1, self.per_byte)
        return (offset << self._shifts(offset.device)).sum(dim=1, dtype=torch.uint8)  # no bits shared: sum is OR

    def _unpack(self, buffer: bytes, offset: int, numel: int) -> torch.Tensor:
        if self.bits == 8:
            return _view(buffer, torch.int8, offset=offset, count=numel)
        packed = _view(buffer, torch.uint8, offset=offset, count=_packed_bytes(numel, self.bits))
        levels = (packed[:, None] >> self._shifts(packed.device)) & ((1 << self.bits) - 1)
        return levels.view(-1)[:numel].to(torch.int8) - self.levels

    def _shifts(self, device: torch.device) -> torch.Tensor:
        return torch.arange(self.per_byte, dtype=torch.uint8, device=device) * self.bits

    def extract(self, serialized_tensor: runtime_pb2.Tensor) -> torch.Tensor:
        numel = math.prod(serialized_tensor.size)
        blocks = _blocks(numel)
        scale = _view(serialized_tensor.buffer, torch.float32, offset=0, count=blocks)
        padded = torch.zeros(blocks * BLOCK_VALUES, dtype=torch.float32)
        padded[:numel] = self._unpack(serialized_tensor.buffer, 4 * blocks, numel)
        values = (padded.view(blocks, BLOCK_VALUES) * scale[:, None]).view(-1)[:numel]  # a hostile scale may make
        return values.reshape(tuple(serialized_tensor.size))  # non-finite values: the receiver refuses those

    def estimate_compression_ratio(self, info: CompressionInfo) -> float:
        return (self.bits / 8 + 4 / BLOCK_VALUES) / 4  # of float32, which is what an all-reduce sends


def _blocks(numel: int) -> int:
    return -(-numel // BLOCK_VALUES)


def _packed_bytes(numel: int, bits: int) -> int:
    return -(-numel * bits // 8)


def _host(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` on the CPU; from a GPU through pinned memory (``non_blocking`` copies land there), which the GPU
    copies into several times faster than into pageable memory."""
    if tensor.device.type != "cuda":
        return tensor
    host = tensor.to("cpu", non_blocking=True)
    torch.cuda.current_stream(tensor.device).synchronize()
    return host


def _view(buffer: bytes, dtype: torch.dtype, *, offset: int, count: int) -> torch.Tensor:
    """`count` values of `buffer` from byte `offset`, without a copy; only read. Raises ValueError past its end."""
    with warnings.catch_warnings():  # torch warns that bytes are read-only: nothing here writes to them
        warnings.simplefilter("ignore", UserWarning)
        return torch.frombuffer(buffer, dtype=dtype, offset=offset, count=count)


_QUANTIZERS: dict[Codec, BlockwiseQuantizer] = {codec: BlockwiseQuantizer(bits) for codec, bits in _BITS.items()}


def wire_dtype_name(codec: Codec) -> str:
    """The dtype label a message in `codec` carries (hivemind's ``runtime_pb2.Tensor.dtype``)."""
    return str(_DTYPES[codec]).removeprefix("torch.")


def wire_bytes(codec: Codec, numel: int) -> int:
    """Exactly how many tensor bytes `numel` values take in `codec`."""
    if codec in _BITS:
        return _packed_bytes(numel, _BITS[codec]) + 4 * _blocks(numel)
    return {"fp32": 4 * numel, "fp16": 2 * numel}[codec]


def encode_tensor(tensor: torch.Tensor, codec: Codec, *, rounding_seed: int | None = None) -> runtime_pb2.Tensor:
    """`tensor` (on any device: quantized or cast there) serialized in `codec`; a blockwise codec rounds at random
    with `rounding_seed` (the same seed, device and values give the same bytes)."""
    if codec in _QUANTIZERS:
        return _QUANTIZERS[codec].quantize(tensor, rounding_seed=rounding_seed)
    return serialize_torch_tensor(_host(tensor.detach().to(_DTYPES[codec])))  # cast first: fewer bytes to copy


def decode_tensor(serialized: runtime_pb2.Tensor, codec: Codec) -> torch.Tensor:
    """The CPU tensor a message sent in `codec` carries (its dtype is `wire_dtype_name(codec)`); the caller has checked
    that the message's compression label is the codec's (COMPRESSION_TYPES)."""
    if codec in _QUANTIZERS:
        return _QUANTIZERS[codec].extract(serialized)
    return deserialize_torch_tensor(serialized)


def round_trip(tensor: torch.Tensor, codec: Codec) -> torch.Tensor:
    """What a receiver gets for `tensor`: its values after encoding and decoding, as float32."""
    return decode_tensor(encode_tensor(tensor, codec), codec).to(torch.float32)


def allreduce_compression(codec: Codec) -> CompressionBase:
    """The hivemind compression an all-reduce sends its parts with in `codec` (fp16: hivemind's cast to half)."""
    return {"fp32": NoCompression(), "fp16": Float16Compression()}.get(codec) or _QUANTIZERS[codec]
