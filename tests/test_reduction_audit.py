"""Every reducer's average is re-reduced by its partners (client/training/reduction_audit.py), from parts each sender
signed (protocol/part_statements.py).

Three real p2p daemons in this process, each with its identity's key, one fp32 ``StageGroup`` each. A reducer that
answers an average within the old bounds but not the aggregate of its parts, or shows parts its senders did not
send, is named by every partner and no one applies the round; a sender whose statement does not match its parts is
left out of it.
"""
import asyncio
import json

import pytest
import torch
from hivemind.proto import averaging_pb2

from hetswarm.client.training import group_allreduce
from hetswarm.client.training.errors import PartialAllReduce
from hetswarm.client.training.group_allreduce import StageGroup
from hetswarm.protocol.codecs import encode_tensor
from hetswarm.protocol.errors import RejectedInput
from hetswarm.protocol.identity import peer_id_of
from hetswarm.protocol.part_statements import MAX_STATEMENT_BYTES, part_digest, read_statement, signed_statement
from tests.helpers.p2p_nodes import keyed_p2ps

SHAPES = [(40, 16), (16,), (7, 3, 5), (300,)]
TIMEOUTS = {"sender_timeout_s": 2.0, "reducer_timeout_s": 4.0}
GROUP = b"\x01" * 32


def _tensors(seed: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=generator) for shape in SHAPES]


async def _round(hostile: list, *, keyed: bool = True) -> tuple[list[list[torch.Tensor]], list, str]:
    """One round of three members, member 2's peer id in `hostile` (a patched class looks for it there); returns
    every member's tensors afterwards, what each member's round raised (None when it ended well), member 2's id."""
    async with keyed_p2ps(3) as keyed_peers:
        hostile.append(keyed_peers[2][0].peer_id)
        members = [p2p.peer_id for p2p, _ in keyed_peers]
        groups = [StageGroup(p2p, members, namespace="audit-test", round_tag="audit-test/v1/stage0",
                             private_key=key if keyed else None, **TIMEOUTS) for p2p, key in keyed_peers]
        for group in groups:
            await group.attach()
        tensors = [_tensors(seed) for seed in range(3)]
        outcomes = await asyncio.gather(*(group.average(local, step=5) for group, local in zip(groups, tensors)),
                                        return_exceptions=True)
        return tensors, list(outcomes), str(members[2])


def _untouched(tensors: list[list[torch.Tensor]], members: range) -> bool:
    return all(torch.equal(got, original) for seed in members for got, original in zip(tensors[seed], _tensors(seed)))


def _named_by_both_partners(tensors: list[list[torch.Tensor]], outcomes: list, culprit: str, why: str) -> None:
    """Members 0 and 1 failed their round naming `culprit` as its cause, saying `why`, and applied nothing."""
    for outcome in outcomes[:2]:
        assert isinstance(outcome, PartialAllReduce) and outcome.cause == culprit, outcome
        assert why in str(outcome), outcome
    assert _untouched(tensors, range(2))


@pytest.mark.swarm
@pytest.mark.timeout(60)
def test_an_audited_round_averages_exactly():
    tensors, outcomes, _ = asyncio.run(_round([]))
    assert outcomes == [None, None, None], outcomes
    for index in range(len(SHAPES)):
        expected = torch.stack([_tensors(seed)[index] for seed in range(3)]).mean(0)
        for local in tensors:
            torch.testing.assert_close(local[index], expected, rtol=1e-6, atol=1e-6)


@pytest.mark.swarm
@pytest.mark.timeout(60)
def test_a_reducer_that_skews_its_averages_within_the_bounds_is_named_by_every_partner(monkeypatch):
    """Member 2 answers the others 1.5 times the true average of its share: finite and far inside the norm bound,
    so only re-reducing it tells. Unaudited, both honest members apply it."""
    hostile: list = []

    class Skewing(group_allreduce.ExactAllReduceRunner):
        def _outgoing_part(self, part_index, averaged):
            serialized, decoded = super()._outgoing_part(part_index, averaged)
            if self.peer_id not in hostile:
                return serialized, decoded
            return encode_tensor(decoded * 1.5, self.codec), decoded

    monkeypatch.setattr(group_allreduce, "ExactAllReduceRunner", Skewing)
    tensors, outcomes, liar = asyncio.run(_round(hostile))
    _named_by_both_partners(tensors, outcomes, liar, "away from the aggregate of the parts it shows")

    hostile.clear()
    tensors, outcomes, _ = asyncio.run(_round(hostile, keyed=False))
    assert outcomes == [None, None, None] and not _untouched(tensors, range(2))  # what the audit prevents


@pytest.mark.swarm
@pytest.mark.timeout(60)
@pytest.mark.parametrize("forgery, why", [("zeros", "bytes its sender's statement does not list"),
                                          ("truncated", "bytes, where")])
def test_a_reducer_that_shows_parts_its_senders_did_not_send_is_named(monkeypatch, forgery, why):
    """Member 2 averages honestly but shows an auditor another part of a sender than the one that sender signed (as
    a reducer would that averaged forged parts: the statement gives it away), or one cut short."""
    hostile: list = []
    honest_show = group_allreduce.shown_part

    def forging(runner, part_index, sender_index):
        response = honest_show(runner, part_index, sender_index)
        if runner.peer_id in hostile and response.metadata:
            part = response.tensors[0]
            part.buffer = bytes(len(part.buffer)) if forgery == "zeros" else part.buffer[:-4]
        return response

    monkeypatch.setattr(group_allreduce, "shown_part", forging)
    tensors, outcomes, liar = asyncio.run(_round(hostile))
    _named_by_both_partners(tensors, outcomes, liar, why)


@pytest.mark.swarm
@pytest.mark.timeout(60)
def test_a_sender_whose_statement_does_not_list_its_parts_is_left_out(monkeypatch):
    hostile: list = []

    class Misstating(group_allreduce.ExactAllReduceRunner):
        async def parts_for_reducer(self, peer_index):
            async for message in super().parts_for_reducer(peer_index):
                if self.peer_id in hostile and message.code == averaging_pb2.PART_FOR_AVERAGING:
                    statement = json.loads(message.peer_id)
                    message.peer_id = signed_statement(  # signed, but for parts it does not send
                        self.private_key, group_id=self.group_id, reducer=self.ordered_peer_ids[peer_index].to_base58(),
                        digests=[part_digest(b"other")] * (len(statement["digests"]) // 64))
                yield message

    monkeypatch.setattr(group_allreduce, "ExactAllReduceRunner", Misstating)
    tensors, outcomes, liar = asyncio.run(_round(hostile))
    _named_by_both_partners(tensors, outcomes, liar, "members left out: " + liar)


def test_a_statement_is_its_senders_for_one_round_and_reducer_only(tmp_path):
    from hetswarm.client.peer.hivemind_compat import load_identity

    key, other = load_identity(tmp_path / "a.key"), load_identity(tmp_path / "b.key")
    sender, reducer = peer_id_of(key.get_public_key()), peer_id_of(other.get_public_key())
    digests = [part_digest(bytes([i])) for i in range(3)]
    raw = signed_statement(key, group_id=GROUP, reducer=reducer, digests=digests)
    assert read_statement(raw, group_id=GROUP, sender=sender, reducer=reducer, parts=3) == digests
    wrong = {"another round": dict(group_id=b"\x02" * 32), "another reducer": dict(reducer=sender),
             "another sender": dict(sender=reducer), "another count": dict(parts=2)}
    for name, change in wrong.items():
        with pytest.raises(RejectedInput):
            read_statement(raw, **({"group_id": GROUP, "sender": sender, "reducer": reducer, "parts": 3} | change))
    forged = json.loads(raw) | {"digests": "".join(reversed(digests))}  # the sender's key, parts it did not sign
    resigned = json.loads(signed_statement(other, group_id=GROUP, reducer=reducer, digests=digests))
    for bad in (json.dumps(forged).encode(), json.dumps(resigned | {"peer": sender}).encode(), b"{", b"[]",
                b"x" * (MAX_STATEMENT_BYTES + 1)):
        with pytest.raises(RejectedInput):
            read_statement(bad, group_id=GROUP, sender=sender, reducer=reducer, parts=3)
