"""Dead letters, per queue, the queue named by its role (``orders``, ``commands``,
``responses``, ``alerts``, ``inventory``, ``payment``, ``shipping``), never by a free-form name:
how many each queue holds, listing them (peek), and replaying or purging them.

What a replay refuses, and why, is :mod:`service.operations.dead_letter_settler`'s. A replay or
purge is recorded in the timeline of each order a message names (when the name can be trusted)
and, whole, in the dead-letter log (:mod:`service.operations.dead_letter_log`).
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Sequence
from typing import Any, Final

from azure.servicebus import ServiceBusReceivedMessage

from adapters.queues import body_of
from domain.messages import ReplayDeadLetter, excerpt
from service.listing import MAX_LIMIT
from service.operations import dead_letter_log, dead_letter_settler, validation
from service.operations.annotate import annotate
from service.operations.context import OperatorContext
from service.operations.models import (
    DeadLetterActionView,
    DeadLetterCount,
    DeadLetterOutcome,
    DeadLetterPage,
    DeadLetterSummary,
    DeadLetterView,
)

audit = logging.getLogger("operator_api.audit")

MAX_BODY_SHOWN: Final = 16 * 1024


async def dead_letter_summary(ctx: OperatorContext, *, limit: int = 100) -> DeadLetterSummary:
    """How many dead letters each of the app's queues holds (counted up to ``limit``)."""
    validation.check_limit(limit, MAX_LIMIT)
    queues = ctx.rt.settings.queues
    peeked = await ctx.queues.peek_each(
        queues.values(), from_sequence=1, limit=limit + 1, dead_letter=True
    )
    counts = [
        DeadLetterCount(
            queue=role, entity=entity, count=min(len(seen), limit), more=len(seen) > limit
        )
        for (role, entity), seen in zip(queues.items(), peeked, strict=True)
    ]
    return DeadLetterSummary(queues=counts)


async def list_dead_letters(
    ctx: OperatorContext, queue: str, *, limit: int = 50, continuation: str | None = None
) -> DeadLetterPage:
    """The dead letters of one of the app's queues, oldest first (peek)."""
    entity = ctx.queue(queue)
    validation.check_limit(limit, MAX_LIMIT)
    start = validation.sequence_cursor(continuation)
    messages = await ctx.queues.peek(entity, from_sequence=start, limit=limit, dead_letter=True)
    more = len(messages) == limit
    return DeadLetterPage(
        queue=queue,
        entity=entity,
        items=[_view(m) for m in messages],
        continuation=str(messages[-1].sequence_number + 1) if more else None,
    )


async def replay_dead_letters(
    ctx: OperatorContext,
    queue: str,
    *,
    operator: str,
    sequence_numbers: Sequence[int] | None = None,
    everything: bool = False,
    dry_run: bool = False,
    limit: int = 100,
    reason: str | None = None,
) -> DeadLetterActionView:
    """Have the pattern app send dead letters back to their queue as first sent, then remove
    them from the dead letters (see :mod:`service.operations.dead_letter_settler` for what is
    refused, and why). ``reason`` is required unless ``dry_run``."""
    return await _settle(
        ctx, "replay", queue, operator, sequence_numbers, everything, dry_run, limit, reason
    )


async def purge_dead_letters(
    ctx: OperatorContext,
    queue: str,
    *,
    operator: str,
    sequence_numbers: Sequence[int] | None = None,
    everything: bool = False,
    dry_run: bool = False,
    limit: int = 100,
    reason: str | None = None,
) -> DeadLetterActionView:
    """Remove dead letters for good. ``reason`` is required unless ``dry_run``."""
    return await _settle(
        ctx, "purge", queue, operator, sequence_numbers, everything, dry_run, limit, reason
    )


async def _settle(
    ctx: OperatorContext,
    kind: dead_letter_settler.Kind,
    queue: str,
    operator: str,
    sequence_numbers: Sequence[int] | None,
    everything: bool,
    dry_run: bool,
    limit: int,
    reason: str | None,
) -> DeadLetterActionView:
    entity = ctx.queue(queue)
    actor = validation.operator_actor(operator)
    wanted = dead_letter_settler.selection(
        list(sequence_numbers) if sequence_numbers else None, everything
    )
    validation.check_limit(limit, dead_letter_settler.MAX_SELECTED)
    validation.dry_run(dry_run)
    why = "" if dry_run and not reason else validation.reason(reason)
    rt = ctx.rt

    async def hand_over(command: ReplayDeadLetter) -> None:
        await rt.bus.send(rt.settings.queue("commands"), command)

    settler = dead_letter_settler.Settler(
        kind=kind,
        role=queue,
        entity=entity,
        keyring=rt.settings.keyring,
        now=rt.clock,
        wanted=wanted,
        actor=actor,
        hand_over=hand_over,
        window=ctx.duplicate_window,
    )
    scan = limit if wanted is None else dead_letter_settler.MAX_SCAN
    if dry_run:
        start = 1 if wanted is None else min(wanted)
        seen = await ctx.queues.peek(entity, from_sequence=start, limit=scan, dead_letter=True)
        for message in seen:
            settler.consider(message)
        more = len(seen) == scan and not settler.enough()
    else:
        more = await ctx.queues.settle_dead_letters(
            entity, settler.act, max_scan=scan, enough=settler.enough
        )
    items = [await _recorded(ctx, o, actor, entity, why) for o in settler.outcomes.values()]
    items = sorted(items + settler.missing(), key=lambda o: o.sequence_number)
    audit.info("%s %s dead letters of %s: %d: %s", actor, kind, entity, len(items), why)
    logged = not dry_run and await dead_letter_log.record(ctx, actor, kind, queue, why, items)
    return DeadLetterActionView(
        action=kind,
        queue=queue,
        entity=entity,
        dry_run=dry_run,
        items=items,
        more=more and wanted is None,
        recorded_in_log=logged,
    )


async def _recorded(
    ctx: OperatorContext, outcome: DeadLetterOutcome, actor: str, entity: str, why: str
) -> DeadLetterOutcome:
    if outcome.order_id is None or outcome.outcome not in ("replayed", "purged"):
        return outcome
    detail = f"{entity} dead letter {outcome.sequence_number} ({outcome.message_id}): {why}"
    event = f"dead_letter_{outcome.outcome}"
    recorded = await annotate(ctx, outcome.order_id, actor, event, detail)
    return outcome.model_copy(update={"recorded_in_timeline": recorded})


def _view(message: ServiceBusReceivedMessage) -> DeadLetterView:
    raw = body_of(message)
    body: Any = None
    shown: str | None = excerpt(raw)
    if len(raw) <= MAX_BODY_SHOWN:
        with contextlib.suppress(ValueError, UnicodeDecodeError, RecursionError):
            body, shown = json.loads(raw, parse_constant=_no_constant), None
    return DeadLetterView(
        sequence_number=message.sequence_number or 0,
        message_id=message.message_id,
        enqueued_at=message.enqueued_time_utc,
        delivery_count=message.delivery_count,
        reason=message.dead_letter_reason,
        description=message.dead_letter_error_description,
        subject=message.subject,
        body=body,
        raw=shown,
    )


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")
