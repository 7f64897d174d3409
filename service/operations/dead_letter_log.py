"""The dead-letter log as operators see it: every replay and purge that was not a dry run is
written to it, whole (who, when, why, each message's outcome), including messages that name no
order, whose action no order timeline can hold; it is read back newest first. The rows are
:mod:`adapters.store.dead_letter_log`'s, in a partition of the orders table.
"""

from __future__ import annotations

import contextlib
import logging
from collections import Counter

from adapters.store.dead_letter_log import MAX_RECENT, DeadLetterLog, LoggedAction, to_entity
from service.operations import validation
from service.operations.context import OperatorContext
from service.operations.models import (
    DeadLetterLogEntry,
    DeadLetterLogView,
    DeadLetterOutcome,
    LoggedDeadLetter,
)

log = logging.getLogger("operator_api")


async def dead_letter_log(ctx: OperatorContext, *, limit: int = 20) -> DeadLetterLogView:
    """The latest dead-letter replays and purges (who, when, why, each message's outcome),
    newest first."""
    validation.check_limit(limit, MAX_RECENT)
    logged = await DeadLetterLog(ctx.orders_table()).recent(limit)
    return DeadLetterLogView(actions=[to_view(a) for a in logged])


async def record(
    ctx: OperatorContext,
    actor: str,
    kind: str,
    queue: str,
    why: str,
    items: list[DeadLetterOutcome],
) -> bool:
    """Write the action to the dead-letter log; False (and a warning) if it cannot be: the
    messages are settled already, so the action stands and the answer says so."""
    entity = to_entity(ctx.rt.clock(), actor, kind, queue, why, items)
    try:
        await DeadLetterLog(ctx.orders_table()).record(entity)
    except Exception:
        log.warning("%s %s of %s not written to the dead-letter log", actor, kind, queue,
                    exc_info=True)  # fmt: skip
        return False
    return True


def to_view(logged: LoggedAction) -> DeadLetterLogEntry:
    """The API's view of one logged action, with its messages counted by outcome; a message's
    outcome that does not read is left out, and the action says ``truncated``."""
    outcomes: list[LoggedDeadLetter] = []
    for stored in logged.outcomes:
        with contextlib.suppress(ValueError):
            outcomes.append(LoggedDeadLetter.model_validate(stored))
    return DeadLetterLogEntry(
        at=logged.at,
        actor=logged.actor,
        action=logged.action,
        queue=logged.queue,
        reason=logged.reason,
        messages=len(outcomes),
        counts=dict(Counter(o.outcome for o in outcomes)),
        outcomes=outcomes,
        truncated=logged.truncated or len(outcomes) < len(logged.outcomes),
    )
