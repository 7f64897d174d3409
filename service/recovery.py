"""Recovering the rows a Supervisor tick handed out (:mod:`service.hand_out`), on whichever
instance takes the message from the scheduler-commands queue.

Each row is recovered as the tick recovers the rows it handles itself
(:func:`service.sweep.recover`): the order is read, the lifecycle decides on this instance's own
clock and the tolerated skew (an order is recovered only once this clock is past its deadline
by the tolerance, as for the tick), the decision is written on condition of the order's ETag
and its messages sent, and the row is moved on, which ends its hand-out. The rows of one
message are recovered concurrently (``SUPERVISOR_CONCURRENCY``); one whose recovery fails is left
handed out and comes due again when the hand-out's lease ends, and the message is completed
(redelivering it would only recover the others again).

A message only the app could have sent reaches this (:mod:`service.inbound` checks its
signature). Each row must belong to the message's bucket: its order id decides its partition,
and a row that does not is refused with an alert (a fault in the sender), the others recovered.
"""

from __future__ import annotations

import asyncio
import logging

from adapters.store.active_index import bucket_partition, index_partition, index_row_key
from adapters.store.rows import ActiveRow
from domain.messages import DueRow, DueRows, OperatorAlert
from service.runtime import Runtime
from service.sweep import recover
from service.sweep_report import Outcomes, record_recoveries

log = logging.getLogger("service.recovery")


async def handle_due_rows(rt: Runtime, message: DueRows, *, caused_by: str | None) -> Outcomes:
    """Recover the orders of ``message``'s rows; what became of them."""
    outcomes = Outcomes()
    partition = bucket_partition(message.bucket)
    rows = [row for row in message.rows if index_partition(row.order_id) == partition]
    if len(rows) < len(message.rows):
        await _misfiled(rt, message, partition, caused_by)
    limit = asyncio.Semaphore(rt.settings.supervisor_concurrency)

    async def one(row: ActiveRow) -> str:
        async with limit:
            return await recover(rt, row)

    handed = [_row(message, row, partition) for row in rows]
    for outcome in await asyncio.gather(*(one(row) for row in handed)):
        outcomes.count(outcome)
    record_recoveries(outcomes)
    if outcomes.errors or outcomes.conflicts:
        log.info("handed-out rows of bucket %d: %s", message.bucket, outcomes)
    return outcomes


def _row(message: DueRows, row: DueRow, partition: str) -> ActiveRow:
    """The index row as the tick left it when it handed it out."""
    return ActiveRow(
        order_id=row.order_id,
        generation=row.generation,
        workflow="",
        written_at=row.written_at,
        due_at=message.leased_until,
        partition_key=partition,
        row_key=index_row_key(row.order_id, row.generation),
        etag=row.etag,
        dispatch_id=message.hand_out,
        dispatched_at=message.dispatched_at,
        due_since=row.due_since,
    )


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
                "recovered, and these come due again when the hand-out's lease ends."
            ),
            source=rt.actor("supervisor"),
            caused_by=caused_by,
        )
    )
