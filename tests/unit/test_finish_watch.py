"""devstack.observe.FinishWatch over the in-memory store: an order is read once it has left the
active-order index, never while it is in flight, and at most a few reads are spent per look."""

from __future__ import annotations

import pytest

from devstack.observe import FinishWatch
from domain.states import ProcessState
from tests.support.world import World

pytestmark = pytest.mark.anyio

ORDERS = [f"o-{n}" for n in range(3)]


class CountingStore:
    """The in-memory store, counting point reads."""

    def __init__(self, world: World) -> None:
        self._store = world.store
        self.reads: list[str] = []

    def all_active(self):  # type: ignore[no-untyped-def]
        return self._store.all_active()

    async def find(self, order_id: str):  # type: ignore[no-untyped-def]
        self.reads.append(order_id)
        return await self._store.find(order_id)


async def test_orders_are_read_once_they_have_left_the_index() -> None:
    world = World()
    for order_id in ORDERS:
        await world.submit(order_id)
    store = CountingStore(world)
    watch = FinishWatch([*ORDERS, "o-not-sent"], reads_per_poll=2)

    assert await watch.poll(store) == []  # type: ignore[arg-type]
    assert watch.in_flight == 3
    assert store.reads == ["o-not-sent"], "orders in flight are not read"

    await world.drain()
    store.reads.clear()
    first = await watch.poll(store)  # type: ignore[arg-type]
    second = await watch.poll(store)  # type: ignore[arg-type]

    assert [o.order_id for o in first] == ORDERS[:2], "in the order given, two per look"
    assert [o.order_id for o in second] == ORDERS[2:]
    assert store.reads == [*ORDERS[:2], ORDERS[2], "o-not-sent"]
    assert {o.state for o in watch.finals.values()} == {ProcessState.PROCESSED}
    assert (watch.unfinished, watch.in_flight) == (1, 0)
