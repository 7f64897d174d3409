"""What the dead-letter listing costs against the local broker: GET /api/dead-letters peeks
every queue's dead letters (seven queues). Opening a receiver's link is what takes time (about
half a second each on the development broker), so the first listing opens one link per queue,
all at once, and later listings open none: they peek on the links kept open.

Links and peeks are counted at the SDK's receiver, not timed: the counts are the same on a
loaded machine. How long the listings take is measured by ``python -m benchmarks.operator_reads``.
"""

from __future__ import annotations

from collections import Counter

import pytest
from azure.servicebus.aio import ServiceBusClient, ServiceBusReceiver

from orderctl.local import LocalOperations

pytestmark = [pytest.mark.anyio, pytest.mark.integration]


class LinkLog:
    """Counts receivers made, links opened (and the most opening at once) and peeks."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: Counter[str] = Counter()
        self.opening = 0
        self.most_opening = 0
        make = ServiceBusClient.get_queue_receiver
        enter = ServiceBusReceiver.__aenter__
        peek = ServiceBusReceiver.peek_messages

        def get_queue_receiver(client, *args, **kwargs):
            self.calls["receiver"] += 1
            return make(client, *args, **kwargs)

        async def aenter(receiver):
            self.calls["open"] += 1
            self.opening += 1
            self.most_opening = max(self.most_opening, self.opening)
            try:
                return await enter(receiver)
            finally:
                self.opening -= 1

        async def peek_messages(receiver, *args, **kwargs):
            self.calls["peek"] += 1
            return await peek(receiver, *args, **kwargs)

        monkeypatch.setattr(ServiceBusClient, "get_queue_receiver", get_queue_receiver)
        monkeypatch.setattr(ServiceBusReceiver, "__aenter__", aenter)
        monkeypatch.setattr(ServiceBusReceiver, "peek_messages", peek_messages)

    def take(self) -> dict[str, int]:
        taken, self.calls = dict(self.calls), Counter()
        return taken


async def test_the_dead_letter_summary_opens_each_link_once_and_at_once(rt, monkeypatch):
    links = LinkLog(monkeypatch)
    queues = len(rt.settings.queues)
    ops = LocalOperations(rt)
    try:
        first = await ops.dead_letter_summary()
        cold = links.take()
        warm = []
        for _ in range(3):
            again = await ops.dead_letter_summary()
            warm.append(links.take())
    finally:
        await ops.close()

    assert {q.queue for q in first.queues} == set(rt.settings.queues)
    assert again.queues == first.queues
    assert cold == {"receiver": queues, "open": queues, "peek": queues}, cold
    assert links.most_opening > 1, "the links were opened one after the other"
    assert warm == [{"peek": queues}] * 3, "a warm listing opens no link: it peeks on the kept ones"
