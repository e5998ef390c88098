"""Activation deltas (AQ-SGD, client/training/activation_deltas.py): both ends of a link keep the same copies, the
quantization error does not pile up from pass to pass, an aborted attempt changes nothing, a delta on an update the
receiver has staged but not committed yet is taken, a receiver that missed an update refuses a delta and the link
heals, and a plan that cannot hold a pass of copies is refused."""
import pytest
import torch

from hetswarm.client.training.activation_deltas import RESEND_WHOLE, DeltaBase, DeltaBuffers, checksum
from hetswarm.client.training.errors import StageError
from hetswarm.client.training.neighbour_streams import StreamPlan
from hetswarm.client.training.stage_start import check_deltas
from hetswarm.client.training.stage_worker import StageConfig
from hetswarm.coordinator.planner import PlannerConfig
from hetswarm.protocol.codecs import decode_tensor, round_trip
from hetswarm.protocol.errors import ConfigError
from hetswarm.protocol.framing import Expectation, FrameError, FrameHeader, decode_frame, encode_frame
from hetswarm.protocol.model_config import get_model_config
from hetswarm.protocol.wire_format import BYTES_PER_VALUE, LOW_RANK_SHARE, WireFormat, candidate_wires

AQ_SGD = WireFormat(activations="8bit", gradients="8bit", allreduce="8bit", activation_deltas="4bit")
SHAPE = (2, 16, 32)


def _link() -> tuple[DeltaBuffers, DeltaBuffers]:
    return DeltaBuffers(whole="8bit", delta="4bit"), DeltaBuffers(whole="8bit", delta="4bit")


def _send(sender: DeltaBuffers, receiver: DeltaBuffers, activation: torch.Tensor, *, step: int, attempt: int = 0,
          sample=(0, 0), commit: bool = True) -> torch.Tensor:
    """One frame over a link, through the real codecs: what the receiver trains on."""
    sent, codec, base_crc = sender.outgoing(activation, attempt=(step, attempt), sample=sample)
    received = receiver.incoming(decode_tensor(sent, codec), attempt=(step, attempt), sample=sample,
                                 base_crc=base_crc, sender="peer-a")
    receiver.stage((step, attempt), sample, received)
    if commit:
        sender.commit((step, attempt))
        receiver.commit((step, attempt))
    return received


def test_both_ends_keep_the_same_copy_and_the_error_does_not_pile_up():
    """Over 30 passes of a slowly drifting activation, the receiver's input stays within one 4-bit step of the
    change (never more than the first pass's 8-bit error plus that), and both copies are the same bits."""
    generator = torch.Generator().manual_seed(0)
    sender, receiver = _link()
    activation = torch.randn(SHAPE, generator=generator) * 3
    first = _send(sender, receiver, activation, step=0)
    assert sender.sent_whole == 1 and float((first - activation).abs().max()) <= activation.abs().max() / 254 * 1.001
    for step in range(1, 31):
        change = torch.randn(SHAPE, generator=generator) * 0.05
        activation = activation + change
        received = _send(sender, receiver, activation, step=step)
        assert checksum(sender._copies[(0, 0)]) == checksum(receiver._copies[(0, 0)])
        # the error left is what 4 bits cut from (activation − last copy): about one level of a change, not a sum
        assert float((received - activation).abs().max()) < 0.05 * 4 / 7
    assert (sender.sent_whole, sender.sent_delta) == (1, 30)


def test_an_aborted_attempt_changes_no_copy():
    sender, receiver = _link()
    activation = torch.randn(SHAPE)
    _send(sender, receiver, activation, step=0)
    before = receiver._copies[(0, 0)].clone()
    _send(sender, receiver, activation + 1.0, step=2, attempt=0, commit=False)  # aborted: no commit
    retried = _send(sender, receiver, activation + 0.1, step=2, attempt=1)
    torch.testing.assert_close(retried, before + round_trip(activation + 0.1 - before, "4bit"), rtol=0, atol=0)
    assert torch.equal(sender._copies[(0, 0)], receiver._copies[(0, 0)])


def test_a_delta_on_an_update_the_receiver_has_not_committed_yet_is_taken_and_the_copies_end_the_same():
    """The sender committed step 2 and runs ahead into step 4 while the receiver still waits for step 2's last vote:
    the step-4 delta names the step-2 copy, which the receiver holds staged (a CI run once saw the refusal, and the
    resend whole, make a run differ from the same run without it)."""
    sender, receiver = _link()
    activation = torch.randn(SHAPE)
    _send(sender, receiver, activation, step=0)
    _send(sender, receiver, activation * 1.1, step=2, commit=False)
    sender.commit((2, 0))
    on_time = _link()
    for step, scale in ((0, 1.0), (2, 1.1), (4, 1.2)):  # the same frames, each committed before the next
        expected = _send(*on_time, activation * scale, step=step)
    received = _send(sender, receiver, activation * 1.2, step=4, commit=False)
    receiver.commit((2, 0))
    for end in (sender, receiver):
        end.commit((4, 0))
    assert torch.equal(received, expected)
    assert all(torch.equal(end._copies[(0, 0)], on_time[0]._copies[(0, 0)]) for end in (sender, receiver))
    assert sender.sent_whole == 1


def test_a_receiver_that_missed_an_update_refuses_the_delta_and_the_link_heals():
    sender, receiver = _link()
    activation = torch.randn(SHAPE)
    _send(sender, receiver, activation, step=0)
    sender.outgoing(activation * 1.1, attempt=(2, 0), sample=(0, 0))  # the receiver never took step 2's frame
    sender.commit((2, 0))
    sent, codec, base_crc = sender.outgoing(activation * 1.2, attempt=(4, 0), sample=(0, 0))
    with pytest.raises(DeltaBase, match=f"peer-a sent a delta .* different copy.*{RESEND_WHOLE}$"):
        receiver.incoming(decode_tensor(sent, codec), attempt=(4, 0), sample=(0, 0), base_crc=base_crc, sender="peer-a")
    sender.forget((0, 0))  # what NeighbourStreams.send does on that verdict
    _send(sender, receiver, activation * 1.2, step=4, attempt=1)
    assert sender.sent_whole == 2 and torch.equal(sender._copies[(0, 0)], receiver._copies[(0, 0)])
    with pytest.raises(DeltaBase, match="holds no copy"):
        DeltaBuffers(whole="8bit", delta="4bit").incoming(sent, attempt=(4, 0), sample=(0, 0), base_crc=base_crc,
                                                          sender="peer-a")


def test_frames_say_whether_they_carry_a_delta():
    tensor = torch.randn(SHAPE)
    expected = Expectation(kind="activations", assignment_version=1, shape=SHAPE, codec="8bit", delta_codec="4bit")
    delta = FrameHeader.for_tensor(tensor, kind="activations", codec="4bit", assignment_version=1, step=3,
                                   micro_batch=0, pipeline=0, base_crc=123)
    header, decoded = decode_frame(encode_frame(delta, tensor), expected=expected)
    assert header.delta and header.base_crc == 123
    torch.testing.assert_close(decoded, round_trip(tensor, "4bit"), rtol=0, atol=0)
    whole = FrameHeader.for_tensor(tensor, kind="activations", codec="8bit", assignment_version=1, step=3,
                                   micro_batch=0, pipeline=0)
    assert not decode_frame(encode_frame(whole, tensor), expected=expected)[0].delta
    wrong_codec = FrameHeader.for_tensor(tensor, kind="activations", codec="8bit", assignment_version=1, step=3,
                                         micro_batch=0, pipeline=0, base_crc=1)
    with pytest.raises(FrameError, match="codec 8bit, expected 4bit"):
        decode_frame(encode_frame(wrong_codec, tensor), expected=expected)
    with pytest.raises(FrameError, match="this plan sends activations whole"):
        decode_frame(encode_frame(delta, tensor), expected=Expectation(kind="activations", assignment_version=1,
                                                                       shape=SHAPE, codec="8bit"))
    with pytest.raises(ValueError, match="names its base_crc"):
        FrameHeader(kind="activations", assignment_version=1, step=0, micro_batch=0, pipeline=0, shape=[1],
                    codec="4bit", delta=True)


def test_the_plan_says_deltas_and_prices_them():
    model = get_model_config("tiny", data_period=10)
    assert candidate_wires("aq-sgd", model) == [AQ_SGD]
    assert AQ_SGD.pipeline_bytes_per_value == (BYTES_PER_VALUE["4bit"] + BYTES_PER_VALUE["8bit"]) / 2
    assert "4bit activation deltas" in AQ_SGD.describe()
    with pytest.raises(ValueError, match="activations: 4bit is for activation deltas and activation gradients only"):
        WireFormat.uniform("4bit")
    with pytest.raises(ValueError, match="activation deltas travel as"):
        WireFormat(activations="8bit", gradients="8bit", allreduce="8bit", activation_deltas="fp16")
    PlannerConfig(model=model, compression="aq-sgd")
    with pytest.raises(ConfigError, match="data_period of at least 2"):
        PlannerConfig(model=get_model_config("tiny"), compression="aq-sgd")


def test_aq_powersgd_sends_deltas_4bit_activation_gradients_and_factors_and_prices_them_all():
    """The combined policy: its wire survives the record's JSON, its hops price 4 bits each way from the second pass
    on, its all-reduce `powersgd`'s factors in two rounds, and it needs a repeating data order."""
    model = get_model_config("small", data_period=10)
    wire, = candidate_wires("aq-powersgd", model)
    assert (wire.activations, wire.gradients, wire.activation_deltas) == ("8bit", "4bit", "4bit")
    assert wire.allreduce_low_rank == LOW_RANK_SHARE and wire.allreduce_rounds == 2
    assert WireFormat.from_dict(wire.to_dict()) == wire
    assert wire.pipeline_bytes_per_value == BYTES_PER_VALUE["4bit"]
    powersgd, = candidate_wires("powersgd", model)
    layers = model.n_layers // 2
    assert (powersgd.allreduce_payload_bytes(model, layers, first=True, last=False)
            == wire.allreduce_payload_bytes(model, layers, first=True, last=False)
            < WireFormat.uniform("8bit").allreduce_payload_bytes(model, layers, first=True, last=False) / 3)
    assert "4bit activation gradients" in wire.describe() and "4bit activation deltas" in wire.describe()
    with pytest.raises(ValueError, match="gradients: 2bit is for activation deltas only; activation gradients"):
        WireFormat(activations="8bit", gradients="2bit", allreduce="8bit")
    with pytest.raises(ValueError, match="allreduce: 4bit is for activation deltas and activation gradients only"):
        WireFormat(activations="8bit", gradients="4bit", allreduce="4bit")
    with pytest.raises(ConfigError, match="compression aq-powersgd sends activation deltas"):
        PlannerConfig(model=get_model_config("small"), compression="aq-powersgd")


def test_4bit_activation_gradients_are_rounded_at_random_by_their_place_in_the_run():
    """A frame of 4-bit gradients is rounded at random (protocol/wire_format.py, ROUNDED_AT_RANDOM), drawn from its
    stage, pipeline, step and micro-batch alone: its retry sends the same bytes, another frame other rounding, and the
    frames' mean tends to the gradient, where rounding to the nearest level sends this small gradient as zeros."""
    wire, = candidate_wires("aq-powersgd", get_model_config("small", data_period=10))
    plan = StreamPlan(assignment_version=1, pipeline=1, stage=2, micro_batches=4, shape=SHAPE, wire=wire,
                      previous=None, next=None, data_period=10)
    gradient = torch.full(SHAPE, 0.01)
    gradient.view(-1)[::256] = 1.0  # each block's largest: 0.01 is below half of its 4-bit level, 1/7
    assert (round_trip(gradient, "4bit") == gradient.where(gradient == 1.0, 0.0)).all()
    frames = [plan.whole_frame("gradients", gradient, "4bit", step=step, micro_batch=m) for step in range(50)
              for m in range(4)]
    assert frames[0] == plan.whole_frame("gradients", gradient, "4bit", step=0, micro_batch=0) != frames[1]
    mean = torch.stack([decode_tensor(frame, "4bit") for frame in frames]).mean(dim=0)
    assert abs(float(mean[gradient == 0.01].mean()) - 0.01) < 0.001
    for kind, codec in (("gradients", "8bit"), ("activations", "4bit")):  # sent as encode_frame encodes them
        assert plan.whole_frame(kind, gradient, codec, step=0, micro_batch=0) is gradient


def test_a_plan_whose_copies_do_not_fit_is_refused_with_what_they_need():
    plan = StreamPlan(assignment_version=1, pipeline=0, stage=0, micro_batches=4, shape=(8, 2048, 2048), wire=AQ_SGD,
                      previous=None, next=None, data_period=1000)
    with pytest.raises(StageError, match=r"1000 steps × 4 micro-batches of \[8, 2048, 2048\] .* 512000 MiB"):
        check_deltas(plan, StageConfig())
    with pytest.raises(StageError, match="data_period of at least 2"):
        check_deltas(StreamPlan(assignment_version=1, pipeline=0, stage=0, micro_batches=4, shape=SHAPE, wire=AQ_SGD,
                                 previous=None, next=None, data_period=None), StageConfig())
