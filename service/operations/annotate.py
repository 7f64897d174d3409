"""Recording an operator's action in an order's timeline (an acknowledged alert, a replayed or
purged dead letter), when the order can still be found and written."""

from __future__ import annotations

import logging
from typing import Final

from adapters.store.rows import ConcurrencyConflict
from service.operations.context import OperatorContext

log = logging.getLogger("operator_api")

CONFLICT_RETRIES: Final = 3


async def annotate(
    ctx: OperatorContext, order_id: str, actor: str, event: str, detail: str
) -> bool:
    """Record ``event`` in the order's timeline; False if it is gone or kept changing."""
    for _ in range(CONFLICT_RETRIES):
        process = await ctx.rt.store.find(order_id)
        if process is None:
            return False
        try:
            await ctx.rt.store.annotate(process, actor=actor, event=event, detail=detail)
            return True
        except ConcurrencyConflict:
            continue
    log.warning("%s not recorded on busy order %s", event, order_id)
    return False
