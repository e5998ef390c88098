"""Activation and gradient frames through real hivemind serialization: round trips and every refusal."""
import asyncio

import hivemind.compression.base
import pytest
import torch
from hivemind.proto import runtime_pb2

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
        tensor, **dict(kind="activations", assignment_version=3, step=5, micro_batch=1, pipeline=0) | tags
    )
    return encode_frame(header, tensor, part_size_bytes=PART_BYTES)


def _expect(**fields):
    return Expectation(**dict(kind="activations", assignment_version=3, shape=SHAPE, dtype=torch.float32) | fields)


def _tensor(dtype=torch.float32):
    return torch.randn(SHAPE, generator=torch.Generator().manual_seed(0)).to(dtype)


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


@pytest.mark.parametrize("legacy", [True, False], ids=["bf16-as-fp32", "bf16-raw"])
def test_bf16_frame_round_trips_in_both_hivemind_modes(monkeypatch, legacy):
    monkeypatch.setattr(hivemind.compression.base, "USE_LEGACY_BFLOAT16", legacy)
    tensor = _tensor(torch.bfloat16)
    messages = _frame(tensor)
    wire_bytes = sum(len(part.buffer) for message in messages for part in message.tensors)
    assert wire_bytes == tensor.numel() * (4 if legacy else 2)
    header, received = decode_frame(messages, expected=_expect(dtype=torch.bfloat16))
    assert received.dtype == torch.bfloat16 and torch.equal(received, tensor)


def test_encoder_refuses_a_header_that_does_not_describe_the_tensor():
    header = FrameHeader.for_tensor(_tensor(), kind="gradients", assignment_version=0, step=0, micro_batch=0,
                                    pipeline=0)
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
        ({}, dict(dtype=torch.bfloat16), FrameError, "dtype float32, expected bfloat16"),
    ],
)
def test_frame_that_is_not_what_the_stage_expects_is_refused(tags, expectation, error, message):
    with pytest.raises(error, match=message) as refused:
        decode_frame(_frame(_tensor(), **tags), expected=_expect(**expectation))
    assert isinstance(refused.value, RejectedInput)


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
        (_frame(_tensor())[0].metadata.replace(b'"float32"', b'"int8"'), "dtype 'int8' is not one of"),
        (_frame(_tensor())[0].metadata.replace(b"}", b', "extra": 1}'), "extra: extra fields not permitted"),
        (b" " * 5000, "over 4096 bytes"),
    ],
    ids=["missing", "not-json", "missing-field", "string-step", "unknown-dtype", "extra-field", "oversized"],
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
    with pytest.raises(FrameError, match="more than float32 \\[2, 8, 16\\] needs"):
        decode_frame([*messages, extra], expected=_expect())


@pytest.mark.parametrize(
    "tamper, message",
    [
        (lambda m: m.pop(), "came in 3 parts, its first part announced 4"),
        (lambda m: m.append(m[-1]), "more parts than the 4 it announced"),
        (lambda m: m[2].tensors[0].ClearField("buffer"), "starts a new tensor or carries no bytes"),
        (lambda m: m[1].tensors.append(m[2].tensors[0]), "carries 2 tensor parts"),
        (lambda m: setattr(m[2], "metadata", m[0].metadata), "after the first carries a header"),
        (lambda m: setattr(m[0].tensors[0], "dtype", "float16"), "tensor is float16 .* header says float32"),
        (lambda m: m[0].tensors[0].size.__setitem__(2, 17), "tensor is float32 \\[2, 8, 17\\]"),
        (lambda m: setattr(m[0].tensors[0], "compression", runtime_pb2.FLOAT16), "compression"),
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
