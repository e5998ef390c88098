"""The coordinator's notices (coordinator/notices.py) on a stand-in record store that keeps what it is given: each
record is stored when what it says changes and refreshed every TTL/2 while it says anything; an emptied one is
stored once, so that readers see it emptied."""
from __future__ import annotations

import asyncio

from hetswarm.coordinator.notices import Notices
from hetswarm.protocol.records import LinkRequests, Refusals
from tests.helpers.swarm_records import IDS

TTL_S = 0.4


class KeptRecords:
    def __init__(self) -> None:
        self.stored: list[Refusals | LinkRequests] = []

    async def publish(self, record, *, ttl_s: float) -> bool:
        assert ttl_s == TTL_S
        self.stored.append(record)
        return True


def test_requests_are_stored_at_each_change_refreshed_while_they_last_and_emptied_once():
    records = KeptRecords()
    notices = Notices(records, coordinator_id=IDS[9], ttl_s=TTL_S)
    pair = (IDS[0], IDS[1])

    async def rounds() -> None:
        await notices.publish({}, {}, ())  # nothing to say: nothing stored
        assert records.stored == []
        await notices.publish({}, {}, [pair])
        await notices.publish({}, {}, [pair])  # unchanged, not due
        assert [type(r) for r in records.stored] == [LinkRequests] and records.stored[0].pairs == [pair]
        await asyncio.sleep(TTL_S / 2)
        await notices.publish({}, {}, [pair])  # due: refreshed
        await notices.publish({}, {}, ())  # emptied: stored once
        await asyncio.sleep(TTL_S / 2)
        await notices.publish({}, {}, ())  # still empty: not refreshed

    asyncio.run(rounds())
    assert [record.pairs for record in records.stored] == [[pair], [pair], []]


def test_a_refused_peer_is_named_in_its_own_record_beside_the_requests():
    records = KeptRecords()
    notices = Notices(records, coordinator_id=IDS[9], ttl_s=TTL_S)
    asyncio.run(notices.publish({IDS[2]: "not admitted"}, {}, [(IDS[0], IDS[1])]))
    refusals = [r for r in records.stored if isinstance(r, Refusals)]
    assert len(refusals) == 1 and refusals[0].refused == {IDS[2]: "not admitted"}
    assert [type(r) for r in records.stored] == [Refusals, LinkRequests]
