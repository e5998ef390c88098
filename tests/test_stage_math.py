"""The distributed training recipe, run by hand in one process, equals the single-process reference.

Each pipeline is a chain of stages that see one another only through detached tensors (GPipe: all forwards, then
all backwards); each stage's replicas average their gradients as the group all-reduce does. The loss and every
gradient must match ``reference_step`` within 1e-5 in fp32 (design.md, training correctness).
"""
import pytest
import torch

from hetswarm.client.training.data import TokenSource, default_corpus
from hetswarm.client.training.model import StageModule, build_full_model, build_stage
from hetswarm.client.training.reference import MicroBatch, micro_batch_loss, reference_step, step_batches
from hetswarm.protocol.framing import Expectation, FrameHeader, decode_frame, encode_frame
from hetswarm.protocol.model_config import get_model_config

TINY = get_model_config("tiny")
SEED = 11
N_PIPELINES = 2


@pytest.fixture(scope="module")
def source() -> TokenSource:
    return TokenSource(default_corpus(100_000))


def _detach(tensor: torch.Tensor, kind: str, micro_batch: int) -> torch.Tensor:
    return tensor.detach().clone()


def _over_the_wire(tensor: torch.Tensor, kind: str, micro_batch: int) -> torch.Tensor:
    """What a neighbour receives: the tensor framed, serialized by hivemind and checked."""
    header = FrameHeader.for_tensor(tensor, kind=kind, codec="fp32", assignment_version=1, step=0,
                                    micro_batch=micro_batch, pipeline=0)
    expected = Expectation(kind=kind, assignment_version=1, shape=tuple(tensor.shape), codec="fp32")
    return decode_frame(encode_frame(header, tensor), expected=expected)[1]


def _run_gpipe(stages: list[StageModule], batches: list[MicroBatch], send) -> float:
    """One pipeline's step: forward every micro-batch through the chain, then backward them in reverse."""
    links, losses = [], []  # per micro-batch: (output sent, input received) at each stage boundary
    for m, (inputs, targets) in enumerate(batches):
        x, boundaries = inputs, []
        for stage in stages[:-1]:
            sent = stage(x)  # (B, T, C)
            x = send(sent, "activations", m).requires_grad_()
            boundaries.append((sent, x))
        links.append(boundaries)
        losses.append(micro_batch_loss(stages[-1](x), targets, micro_batches=len(batches)))
    for m in reversed(range(len(batches))):
        losses[m].backward()
        for sent, received in reversed(links[m]):
            sent.backward(send(received.grad, "gradients", m))
    return sum(loss.item() for loss in losses)


@pytest.mark.parametrize("d_pp, send", [(2, _detach), (3, _detach), (2, _over_the_wire)],
                         ids=["2-stages", "3-uneven-stages", "2-stages-over-hivemind-frames"])
def test_pipelined_data_parallel_step_equals_the_reference(source, d_pp, send):
    batches = step_batches(source, TINY, step=0, n_pipelines=N_PIPELINES)
    reference = reference_step(build_full_model(TINY, seed=SEED), batches)

    replicas = [[build_stage(TINY, s, d_pp, seed=SEED) for s in range(d_pp)] for _ in range(N_PIPELINES)]
    pipeline_losses = [_run_gpipe(stages, pipeline, send) for stages, pipeline in zip(replicas, batches)]
    assert sum(pipeline_losses) / N_PIPELINES == pytest.approx(reference.loss, abs=1e-5)

    checked = set()
    for s in range(d_pp):
        group = [dict(stages[s].named_parameters()) for stages in replicas]  # one stage, every replica
        for name in group[0]:
            averaged = torch.stack([params[name].grad for params in group]).mean(0)  # the all-reduce
            torch.testing.assert_close(averaged, reference.grads[name], rtol=1e-5, atol=1e-5, msg=name)
            checked.add(name)
    assert checked == set(reference.grads)
    assert max(grad.abs().max().item() for grad in reference.grads.values()) > 1e-3  # not vacuously zero


def test_pipelines_train_on_different_data(source):
    (first, *_), (second, *_) = step_batches(source, TINY, step=0, n_pipelines=N_PIPELINES)
    assert not torch.equal(first[0], second[0])


def test_adamw_lowers_the_loss_of_the_tiny_model(source):
    torch.manual_seed(0)
    model = build_full_model(TINY, seed=SEED)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    losses = []
    for step in range(30):
        losses.append(reference_step(model, step_batches(source, TINY, step=step, n_pipelines=1)).loss)
        optimizer.step()
    assert losses[-1] < 0.6 * losses[0], losses  # about 5.6 → 2.5 in 30 steps
