"""A submitter's reply queue that refuses status updates (issue 28, item 4): the shell holds them
on the order and sends them again, in order, once the queue takes them; a failure that a second
try may cure is no refusal, and raises so that the outbox sends the update again.

On the in-memory world (tests/support/world.py): the app's handlers, the Supervisor's tick and a
reply queue that refuses while told to.
"""

from __future__ import annotations

import pytest
from azure.servicebus._pyamqp.error import AuthenticationException, ErrorCondition, TokenAuthFailure
from azure.servicebus.exceptions import (
    MessagingEntityDisabledError,
    MessagingEntityNotFoundError,
    OperationTimeoutError,
    ServiceBusAuthenticationError,
    ServiceBusAuthorizationError,
    ServiceBusConnectionError,
)

from domain.messages import OperatorAlert
from domain.states import ProcessState
from service.apply import refuses
from tests.support.world import QUEUES, World, order_id

pytestmark = pytest.mark.anyio


def token_refused(status: int) -> ServiceBusAuthenticationError:
    """What the SDK raises when the broker answers the queue's token with ``status``."""
    return ServiceBusAuthenticationError(
        message="CBS Token authentication failed.", error=TokenAuthFailure(status, b"refused")
    )


@pytest.mark.parametrize(
    "error",
    [
        MessagingEntityNotFoundError(message="gone"),
        MessagingEntityDisabledError(message="disabled"),
        ServiceBusAuthorizationError(message="no Send claim"),
        token_refused(404),  # no such queue: Service Bus and the development broker say so
        token_refused(401),
    ],
)
def test_a_queue_that_does_not_exist_is_disabled_or_forbidden_refuses(error):
    assert refuses(error)


@pytest.mark.parametrize(
    "error",
    [
        # A broker restarting breaks the token link; a token may expire: the next try may pass.
        ServiceBusAuthenticationError(
            message="link",
            error=AuthenticationException(
                ErrorCondition.InternalError, description="Failed to open CBS authentication link."
            ),
        ),
        ServiceBusAuthenticationError(message="no inner error"),
        token_refused(500),
        OperationTimeoutError(message="timed out"),
        ServiceBusConnectionError(message="connection reset"),
    ],
)
def test_a_failure_a_second_try_may_cure_is_no_refusal(error):
    assert not refuses(error)


def alerts(world: World) -> list[OperatorAlert]:
    return [a for a in world.sent(QUEUES["alerts"]) if isinstance(a, OperatorAlert)]


async def events(world: World, order: str) -> list[str]:
    return [e.event for e in await world.store.get_timeline(order)]


async def finish(world: World, order: str) -> None:
    """Deliver requests and replies, no fault, until ``order`` has finished."""
    for _ in range(20):
        if (await world.store.load(order)).state.terminal:
            return
        for kind in ("agent", "responses"):
            for envelope in world.deliverable(kind):
                await world.deliver(envelope)
    raise AssertionError(f"{order} did not finish: {world.describe()}")


async def test_updates_a_refusing_queue_missed_arrive_in_order_once_it_takes_them():
    world = World()
    world.replies.refusing = True
    first = order_id(0)
    await world.submit(first)
    await finish(world, first)
    order = await world.store.load(first)
    assert order.state is ProcessState.PROCESSED, "the order went on"
    assert world.statuses(first) == [], "nothing could be delivered"
    assert world.store.index.get(first, order.generation) is not None, "its row waits to retry"
    assert (await events(world, first)).count("replies_held") == 1, "one write holds them"
    assert [a.reason for a in alerts(world)] == ["reply_queue_unavailable"]

    await world.drain()  # the queue takes sends again; the Supervisor sends the held updates
    updates = world.updates(first)
    status_seq = (await world.store.load(first)).status_seq
    assert [u.sequence for u in updates] == list(range(status_seq))
    assert [u.state for u in updates if u.state in ("Processed", "Error")] == ["Processed"]
    assert "replies_resent" in await events(world, first)
    assert not world.store.index.rows()
    await world.check_final()


async def test_an_order_sent_to_a_queue_known_to_refuse_is_held_without_a_try():
    world = World()
    world.replies.refusing = True
    await world.submit(order_id(0))
    tried = world.replies.refused
    await world.submit(order_id(1))
    assert world.replies.refused == tried, "the process remembers the refusal for a while"
    held = await world.store.load(order_id(1))
    assert [o.not_before is not None for o in held.outbox if o.to == "reply"] == [True, True]
    assert [a.reason for a in alerts(world)] == ["reply_queue_unavailable"], "alerted once"
    await world.drain()
    await world.check_final()


async def test_a_failure_a_second_try_may_cure_is_sent_again_by_the_outbox():
    world = World()
    world.replies.fail_next = 1  # a token link broken by a broker restart, once
    with pytest.raises(ServiceBusAuthenticationError):
        await world.submit(order_id(0))
    order = await world.store.load(order_id(0))
    assert all(o.not_before is None for o in order.outbox), "nothing held: it was no refusal"
    assert world.statuses(order_id(0)) == []
    await world.submit(order_id(0))  # the submission is redelivered: the order sends what it owes
    assert world.statuses(order_id(0)) == [0, 1]
    assert alerts(world) == []
    await world.drain()
    await world.check_final()
