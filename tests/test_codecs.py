"""Each wire codec keeps its documented error bound (protocol/codecs.py), and error feedback loses nothing over a run
(client/training/error_feedback.py)."""
import math

import pytest
import torch

from hetswarm.client.training.error_feedback import ErrorFeedback
from hetswarm.protocol.codecs import decode_tensor, encode_tensor, round_trip, wire_bytes
from hetswarm.protocol.model_config import get_model_config
from hetswarm.protocol.wire_format import BLOCK_VALUES, WireFormat, candidate_wires


def _samples() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    normal = torch.randn(4096, generator=generator)
    heavy = torch.distributions.StudentT(2.0).sample((4096,))  # outliers, as activations have
    return {"normal": normal * 3 + 1, "heavy-tailed": heavy, "tiny": normal * 1e-6, "shifted": normal + 100,
            "activations": torch.randn(2, 64, 64, generator=generator)}


@pytest.mark.parametrize("name", list(_samples()))
def test_fp32_is_exact_and_fp16_within_its_relative_bound(name):
    x = _samples()[name]
    assert torch.equal(round_trip(x, "fp32"), x)
    normal = x.abs() >= 2**-14
    error = (round_trip(x, "fp16") - x).abs()
    assert (error[normal] <= 2**-11 * x.abs()[normal]).all()


_LEVELS = {"8bit": 127, "4bit": 7, "2bit": 1}


@pytest.mark.parametrize("codec", list(_LEVELS))
@pytest.mark.parametrize("name", list(_samples()))
def test_blockwise_codecs_are_within_half_a_level_of_their_block_and_keep_zeros(codec, name):
    x = _samples()[name].reshape(-1)[:4093]  # a last block that is not full, and values that do not fill a byte
    x[:BLOCK_VALUES // 2] = 0.0  # zeros among other values must come back as zeros
    decoded = round_trip(x, codec)
    blocks = torch.nn.functional.pad(x, (0, -x.numel() % BLOCK_VALUES)).view(-1, BLOCK_VALUES)
    bound = (blocks.abs().amax(dim=1) / (2 * _LEVELS[codec])).repeat_interleave(BLOCK_VALUES)[: x.numel()]
    assert ((decoded - x).abs() <= bound * (1 + 1e-5) + 1e-30).all()
    assert (decoded[: BLOCK_VALUES // 2] == 0).all()
    bits = {"8bit": 8, "4bit": 4, "2bit": 2}[codec]
    assert len(encode_tensor(x, codec).buffer) == wire_bytes(codec, x.numel()) < (bits / 8 + 0.02) * x.numel()


@pytest.mark.parametrize("codec", list(_LEVELS))
@pytest.mark.parametrize("x", [torch.zeros(7), torch.tensor([3.5]), torch.tensor([-2.0, 0.0, 2.0])],
                         ids=["zeros", "single", "symmetric"])
def test_blockwise_codecs_send_a_block_of_one_magnitude_exactly(codec, x):
    assert torch.equal(round_trip(x, codec), x)


@pytest.mark.parametrize("codec", list(_LEVELS))
def test_rounding_at_random_stays_within_a_level_and_averages_to_the_values(codec):
    """What 4-bit activation gradients are sent with (ROUNDED_AT_RANDOM): one of the two levels around each value,
    unbiased, so values below half a level are not always zero; the same seed sends the same bytes."""
    x = _samples()["heavy-tailed"].reshape(-1)[:4093]
    x[:BLOCK_VALUES // 2] = 0.0
    blocks = torch.nn.functional.pad(x, (0, -x.numel() % BLOCK_VALUES)).view(-1, BLOCK_VALUES)
    level = (blocks.abs().amax(dim=1) / _LEVELS[codec]).repeat_interleave(BLOCK_VALUES)[: x.numel()]
    draws = torch.stack([decode_tensor(encode_tensor(x, codec, rounding_seed=seed), codec) for seed in range(400)])
    assert ((draws - x).abs() < level * (1 + 1e-5)).all()
    assert (draws[:, : BLOCK_VALUES // 2] == 0).all()
    small = (x.abs() < level / 2) & (x != 0)  # what rounding to the nearest level sends as zero, every time
    assert small.sum() > 100 and (round_trip(x, codec)[small] == 0).all()
    # the mean of 400 draws is within 4 standard errors of each value (a draw's spread is at most half a level)
    assert ((draws.mean(dim=0) - x).abs() <= 4 * (level / 2) / math.sqrt(len(draws)) + 1e-30).all()
    assert encode_tensor(x, codec, rounding_seed=7) == encode_tensor(x, codec, rounding_seed=7)
    assert encode_tensor(x, codec, rounding_seed=7) != encode_tensor(x, codec, rounding_seed=8)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("codec", ["fp32", "fp16", *_LEVELS])
def test_a_gpu_tensor_is_encoded_on_its_device_to_the_bytes_the_cpu_sends(codec):
    """A GPU stage quantizes where its activations are; receivers on any device must read the same bytes."""
    x = _samples()["heavy-tailed"].reshape(-1)[:4093]
    assert encode_tensor(x.cuda(), codec).SerializeToString() == encode_tensor(x, codec).SerializeToString()


@pytest.mark.parametrize("codec", ["fp16", "8bit"])
def test_error_feedback_sends_everything_but_the_last_residual(codec):
    """Σ sent_t + e_T = Σ g_t: the residual carried is exactly the error made, so nothing is lost over a run."""
    generator = torch.Generator().manual_seed(1)
    feedback, key = ErrorFeedback(), ("sent", 0)
    computed, sent = torch.zeros(1000, dtype=torch.float64), torch.zeros(1000, dtype=torch.float64)
    for step in range(50):
        gradient = torch.randn(1000, generator=generator) * 1e-3 + 2e-4  # a small bias the codec could lose
        feedback.begin(step)
        value = gradient + feedback.residual(key, gradient)
        decoded = round_trip(value, codec)
        feedback.record((step, 0), key, value - decoded)
        feedback.complete((step, 0))
        assert torch.equal(feedback._made[key], value - decoded)  # the residual is the error made
        computed += gradient.double()
        sent += decoded.double()
    feedback.begin(50)
    residual = feedback.residual(key, gradient).double()
    torch.testing.assert_close(sent + residual, computed, rtol=0, atol=1e-6)
    assert float(residual.abs().max()) < float(computed.abs().max()) / 10  # bounded by one step's error


def test_error_feedback_retries_from_what_the_step_started_with():
    feedback, key, like = ErrorFeedback(), "k", torch.zeros(3)
    feedback.begin(0)
    feedback.record((0, 0), key, torch.ones(3))
    feedback.complete((0, 0))
    feedback.begin(1)  # step 0 committed: its residual is carried into step 1
    assert torch.equal(feedback.residual(key, like), torch.ones(3))
    feedback.record((1, 0), key, torch.full((3,), 2.0))
    feedback.complete((1, 0))
    feedback.begin(1, attempt=1)  # step 1 is tried again: it starts again from step 0's residual
    assert torch.equal(feedback.residual(key, like), torch.ones(3))
    feedback.record((1, 1), key, torch.full((3,), 5.0))  # this try fails before completing
    feedback.begin(1, attempt=2)
    assert torch.equal(feedback.residual(key, like), torch.ones(3))
    feedback.begin(0)  # rolled back: residuals of a later trajectory are not carried
    assert torch.equal(feedback.residual(key, like), like)


def test_a_late_part_of_an_abandoned_attempt_does_not_become_the_retrys_residual():
    feedback, key, like = ErrorFeedback(), ("reduced", 0), torch.zeros(3)
    feedback.begin(4, attempt=0)
    feedback.begin(4, attempt=1)  # attempt 0 was aborted; the retry reduces the same part
    feedback.record((4, 1), key, torch.full((3,), 2.0))
    feedback.record((4, 0), key, torch.full((3,), 7.0))  # attempt 0's reducer answers a member late
    feedback.complete((4, 0))  # ... and its round finishes: neither counts
    feedback.begin(5)
    assert torch.equal(feedback.residual(key, like), like)  # attempt 1 never completed: nothing carried
    feedback.record((5, 0), key, torch.full((3,), 3.0))
    feedback.record((4, 1), key, torch.full((3,), 9.0))
    feedback.complete((5, 0))
    feedback.begin(6)
    assert torch.equal(feedback.residual(key, like), torch.full((3,), 3.0))


def test_policies_choose_their_wires():
    model = get_model_config("tiny")
    assert candidate_wires("model", model) == [WireFormat(activations="fp16", gradients="fp16", allreduce="fp32")]
    assert candidate_wires("none", model) == [WireFormat.uniform("fp32")]
    assert [w.allreduce for w in candidate_wires("auto", model)] == ["fp32", "fp16", "8bit"]
    assert math.isclose(WireFormat(activations="fp16", gradients="8bit", allreduce="8bit").pipeline_bytes_per_value,
                        (2 + 1 + 4 / BLOCK_VALUES) / 2)
