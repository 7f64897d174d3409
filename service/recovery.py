"""Recovering the rows a Supervisor tick handed out (:mod:`service.hand_out`), on whichever
instance takes the message from the scheduler-commands queue.

The instance first reads the message's rows (one query over their range of keys) and recovers
those still handed out: by this hand-out, or by a later one (the lease ran out while this
message waited, and a tick handed the row out again; this message, earlier in the queue,
recovers it, and the later one then finds it moved on). A row moved on already (recovered, or
an order write moved it since) costs nothing more. So a row handed out twice is read twice
and recovered once, and a backlog longer than a lease costs a query per message, not a second
recovery.

Each row is recovered as the tick recovers the rows it handles itself
(:func:`service.sweep.look`): the order is read, the lifecycle decides on this instance's own
clock and the tolerated skew (an order is recovered only once this clock is past its deadline
by the tolerance, as for the tick), the decision is written on condition of the order's ETag
and its messages sent. The rows of one message are recovered concurrently
(``SUPERVISOR_CONCURRENCY``), then moved on together, which ends their hand-out: one transaction
(:meth:`adapters.store.active_index.ActiveOrderIndex.move_on`). One whose recovery fails is left
handed out and comes due again when the hand-out's lease ends, and the message is completed
(redelivering it would only read the others again).

A message only the app could have sent reaches this (:mod:`service.inbound` checks its
signature). Each row must belong to the message's bucket: its order id decides its partition,
and a row that does not is refused with an alert (a fault in the sender), the others recovered.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime

from adapters.store.active_index import bucket_partition, index_partition, index_row_key
from adapters.store.rows import ActiveRow
from domain.messages import DueRows, OperatorAlert
from service.runtime import Runtime
from service.sweep import look
from service.sweep_report import Outcomes, record_recoveries

log = logging.getLogger("service.recovery")


async def handle_due_rows(rt: Runtime, message: DueRows, *, caused_by: str | None) -> Outcomes:
    """Recover the orders of ``message``'s rows still handed out; what became of them."""
    outcomes = Outcomes()
    partition = bucket_partition(message.bucket)
    keys = [
        index_row_key(row.order_id, row.generation)
        for row in message.rows
        if index_partition(row.order_id) == partition
    ]
    if len(keys) < len(message.rows):
        await _misfiled(rt, message, partition, caused_by)
    rows = await rt.store.index.handed_out(message.bucket, keys)
    limit = asyncio.Semaphore(rt.settings.supervisor_concurrency)

    async def one(row: ActiveRow) -> tuple[str, datetime | None]:
        async with limit:
            return await look(rt, row)

    looked = await asyncio.gather(*(one(row) for row in rows))
    for outcome, _ in looked:
        outcomes.count(outcome)
    outcomes.moved_on = len(keys) - len(rows)
    moves = [(row, move_to) for row, (_, move_to) in zip(rows, looked, strict=True) if move_to]
    await rt.store.index.move_on(moves)
    record_recoveries(outcomes)
    if outcomes.errors or outcomes.conflicts:
        log.info("handed-out rows of bucket %d: %s", message.bucket, outcomes)
    return outcomes


async def _misfiled(rt: Runtime, message: DueRows, partition: str, caused_by: str | None) -> None:
    wrong = [r.order_id for r in message.rows if index_partition(r.order_id) != partition]
    await rt.alert(
        OperatorAlert(
            order_id=None,
            severity="error",
            reason="bad_message",
            detail=(
                f"rejected {len(wrong)} row(s) of a DueRows message for bucket "
                f"{message.bucket}: the orders {', '.join(wrong[:5])} are not in that bucket "
                "(their ids hash to another). The sender built it wrong; its other rows were "
                "recovered."
            ),
            source=rt.actor("supervisor"),
            caused_by=caused_by,
        )
    )
