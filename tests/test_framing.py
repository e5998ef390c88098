"""Activation and gradient frames through real hivemind serialization: round trips and every refusal."""
import asyncio

import pytest
import torch
from hivemind.proto import runtime_pb2

from hetswarm.protocol.codecs import round_trip, wire_bytes
from hetswarm.protocol.errors import RejectedInput
from hetswarm.protocol.framing import (
    Expectation,
    FrameError,
    FrameHeader,
    VersionMismatch,
    decode_frame,
    encode_frame,
    read_frame,
)

SHAPE = (2, 8, 16)
PART_BYTES = 256  # small parts, so every frame here spans several messages


def _frame(tensor, **tags):
    header = FrameHeader.for_tensor(
        tensor, **dict(kind="activations", codec="fp32", assignment_version=3, step=5, micro_batch=1, pipeline=0) | tags
    )
    return encode_frame(header, tensor, part_size_bytes=PART_BYTES)


def _expect(**fields):
    return Expectation(**dict(kind="activations", assignment_version=3, shape=SHAPE, codec="fp32") | fields)


def _tensor(shape=SHAPE):
    return torch.randn(shape, generator=torch.Generator().manual_seed(0))


BIG = (4, 16, 64)  # large enough that an 8-bit frame, codebook included, is smaller than fp32


def test_fp32_frame_round_trips_through_a_stream():
    tensor = _tensor()
    messages = _frame(tensor)
    assert len(messages) == 2 * 8 * 16 * 4 // PART_BYTES

    async def stream():
        for message in messages:
            yield message

    header, received = asyncio.run(read_frame(stream(), expected=_expect(step=5, pipeline=0, micro_batches=2)))
    assert (header.kind, header.assignment_version, header.step, header.micro_batch) == ("activations", 3, 5, 1)
    assert received.dtype == torch.float32 and torch.equal(received, tensor)


@pytest.mark.parametrize("codec, width", [("fp16", 2), ("8bit", 1)])
def test_compressed_frame_carries_its_codec_bytes_and_decodes_to_the_round_trip(codec, width):
    tensor = _tensor(BIG)
    messages = _frame(tensor, codec=codec)
    sent = sum(len(part.buffer) for message in messages for part in message.tensors)
    assert sent == wire_bytes(codec, tensor.numel()) < tensor.numel() * 4
    assert sent - tensor.numel() * width in (0, 4 * tensor.numel() // 256)  # 8-bit frames also carry block scales
    header, received = decode_frame(messages, expected=_expect(codec=codec, shape=BIG))
    assert header.codec == codec and torch.equal(received.float(), round_trip(tensor, codec))


def test_encoder_refuses_a_header_that_does_not_describe_the_tensor():
    header = FrameHeader.for_tensor(_tensor(), kind="gradients", codec="fp32", assignment_version=0, step=0,
                                    micro_batch=0, pipeline=0)
    with pytest.raises(ValueError, match="header says"):
        encode_frame(header, torch.zeros(3))


@pytest.mark.parametrize(
    "tags, expectation, error, message",
    [
        (dict(assignment_version=2), {}, VersionMismatch, "assignment version 2, this stage runs version 3"),
        (dict(kind="gradients"), {}, FrameError, "kind gradients, expected activations"),
        (dict(step=4), dict(step=5), FrameError, "step 4, expected 5"),
        (dict(pipeline=1), dict(pipeline=0), FrameError, "pipeline 1, expected 0"),
        (dict(micro_batch=2), dict(micro_batches=2), FrameError, "micro_batch 2, but a step has 2"),
        ({}, dict(shape=(2, 8, 17)), FrameError, r"shape \[2, 8, 16\], expected \[2, 8, 17\]"),
        ({}, dict(codec="8bit"), FrameError, "codec fp32, expected 8bit"),
        (dict(kind="gradients"), dict(kind=("activations", "held-out")), FrameError,
         "kind gradients, expected activations or held-out"),
        (dict(kind="held-out", base_crc=7), dict(kind=("activations", "held-out"), delta_codec="fp32"), FrameError,
         "held-out delta, but this plan sends held-out whole"),
    ],
)
def test_frame_that_is_not_what_the_stage_expects_is_refused(tags, expectation, error, message):
    with pytest.raises(error, match=message) as refused:
        decode_frame(_frame(_tensor(), **tags), expected=_expect(**expectation))
    assert isinstance(refused.value, RejectedInput)


def test_the_previous_stage_may_send_activations_and_held_out_activations_each_under_its_kind():
    tensor = _tensor()
    for kind in ("activations", "held-out"):
        header, received = decode_frame(_frame(tensor, kind=kind), expected=_expect(kind=("activations", "held-out")))
        assert header.kind == kind and torch.equal(received, tensor)


def _with_header(metadata: bytes) -> list[runtime_pb2.ExpertRequest]:
    messages = _frame(_tensor())
    messages[0].metadata = metadata
    return messages


@pytest.mark.parametrize(
    "metadata, message",
    [
        (b"", "carries no header"),
        (b"\xff not json", "malformed frame header"),
        (b'{"kind": "activations"}', "malformed frame header: assignment_version: field required"),
        (_frame(_tensor())[0].metadata.replace(b'"step": 5', b'"step": "5"'), "malformed frame header: step"),
        (_frame(_tensor())[0].metadata.replace(b'"fp32"', b'"int8"'), "codec: unexpected value"),
        (_frame(_tensor())[0].metadata.replace(b"}", b', "extra": 1}'), "extra: extra fields not permitted"),
        (b" " * 5000, "over 4096 bytes"),
    ],
    ids=["missing", "not-json", "missing-field", "string-step", "unknown-codec", "extra-field", "oversized"],
)
def test_malformed_header_is_refused(metadata, message):
    with pytest.raises(FrameError, match=message):
        decode_frame(_with_header(metadata), expected=_expect())


def test_reading_stops_at_the_byte_limit():
    messages, consumed = _frame(_tensor()), []

    def counting():
        for message in messages:
            consumed.append(message)
            yield message

    limit = messages[0].ByteSize() + messages[1].ByteSize() + 1  # the third message crosses it
    with pytest.raises(FrameError, match=f"exceeds {limit} bytes; stopped reading"):
        decode_frame(counting(), expected=_expect(), max_frame_bytes=limit)
    assert len(consumed) == 3 < len(messages)


def test_more_tensor_bytes_than_the_shape_needs_are_refused_while_reading():
    messages = _frame(_tensor())
    extra = runtime_pb2.ExpertRequest(tensors=[runtime_pb2.Tensor(buffer=b"\0" * PART_BYTES)])
    messages[0].tensors[0].chunks += 1  # announce the extra part, so only the byte count can catch it
    with pytest.raises(FrameError, match="more than fp32 \\[2, 8, 16\\] needs"):
        decode_frame([*messages, extra], expected=_expect())


@pytest.mark.parametrize(
    "tamper, message",
    [
        (lambda m: m.pop(), "came in 3 parts, its first part announced 4"),
        (lambda m: m.append(m[-1]), "more parts than the 4 it announced"),
        (lambda m: m[2].tensors[0].ClearField("buffer"), "starts a new tensor or carries no bytes"),
        (lambda m: m[1].tensors.append(m[2].tensors[0]), "carries 2 tensor parts"),
        (lambda m: setattr(m[2], "metadata", m[0].metadata), "after the first carries a header"),
        (lambda m: setattr(m[0].tensors[0], "dtype", "float16"), "tensor is float16 .* header says fp32"),
        (lambda m: m[0].tensors[0].size.__setitem__(2, 17), "tensor is float32 \\[2, 8, 17\\]"),
        (lambda m: setattr(m[0].tensors[0], "compression", runtime_pb2.FLOAT16), "uses FLOAT16, its header's codec"),
        (lambda m: m.clear(), "ended before a frame began"),
    ],
    ids=["truncated", "extra-part", "empty-part", "two-parts", "second-header", "dtype-lie", "shape-lie",
         "compressed", "empty-stream"],
)
def test_inconsistent_frame_is_refused(tamper, message):
    messages = _frame(_tensor())
    tamper(messages)
    with pytest.raises(FrameError, match=message):
        decode_frame(messages, expected=_expect())


def _relabelled(codec: str, as_codec: str) -> list[runtime_pb2.ExpertRequest]:
    """A frame encoded in `codec` whose header claims `as_codec`."""
    messages = _frame(_tensor(BIG), codec=codec)
    messages[0].metadata = messages[0].metadata.replace(f'"{codec}"'.encode(), f'"{as_codec}"'.encode())
    return messages


@pytest.mark.parametrize(
    "codec, as_codec, message",
    [
        ("8bit", "fp32", "uses BLOCKWISE_8BIT, its header's codec fp32 is sent as NONE"),
        ("fp32", "8bit", r"more than 8bit \[4, 16, 64\] needs"),
        ("fp16", "fp32", r"tensor is float16 \[4, 16, 64\], its header says fp32"),
        ("fp32", "fp16", r"tensor is float32 .* header says fp16|more than fp16 .* needs"),
    ],
)
def test_compressed_frame_whose_header_does_not_match_its_payload_is_refused(codec, as_codec, message):
    with pytest.raises(FrameError, match=message):
        decode_frame(_relabelled(codec, as_codec), expected=_expect(codec=as_codec, shape=BIG))


def test_8bit_frame_whose_scales_are_not_finite_is_refused():
    messages = _frame(_tensor(BIG), codec="8bit")
    buffer = messages[0].tensors[0].buffer
    messages[0].tensors[0].buffer = b"\x00\x00\x80\x7f" + buffer[4:]  # the first block's scale: +inf
    with pytest.raises(FrameError, match="NaN or infinite"):
        decode_frame(messages, expected=_expect(codec="8bit", shape=BIG))
