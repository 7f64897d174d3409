"""Whether the app can work, cheaply: its settings loaded (it would not have started otherwise),
the orders table answers, Service Bus answers. Each check says what it found and how long it
took; a check that fails says why, and the others still run."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Literal

from azure.core.exceptions import ResourceNotFoundError

from service.operations.context import OperatorContext
from service.operations.models import HealthCheck, HealthView

log = logging.getLogger("operator_api")

CheckName = Literal["settings", "table", "servicebus"]


async def health(ctx: OperatorContext) -> HealthView:
    """Whether the app can work, cheaply: its settings loaded (it would not have started
    otherwise), the orders table answers (one point read of a row that never exists),
    Service Bus answers (one peek of the alerts queue)."""
    settings = ctx.rt.settings
    checks = [
        HealthCheck(
            name="settings",
            ok=True,
            detail=f"{len(settings.queues)} queues, orders table {settings.orders_table}, "
            f"workflows {', '.join(sorted(ctx.rt.workflows))}",
            duration_ms=0.0,
        ),
        await _timed("table", lambda: _table_check(ctx)),
        await _timed("servicebus", lambda: _bus_check(ctx)),
    ]
    return HealthView(status="ok" if all(c.ok for c in checks) else "failing", checks=checks)


async def _table_check(ctx: OperatorContext) -> tuple[bool, str]:
    name = ctx.rt.settings.orders_table
    try:
        await ctx.orders_table().get_entity("~health", "probe")
    except ResourceNotFoundError as missing:
        if getattr(missing, "error_code", None) == "TableNotFound":
            return False, f"table {name} does not exist"
    return True, f"table {name} answers"


async def _bus_check(ctx: OperatorContext) -> tuple[bool, str]:
    entity = ctx.queue("alerts")
    await ctx.queues.peek(entity, from_sequence=1, limit=1)
    return True, f"queue {entity} answers"


async def _timed(name: CheckName, check: Callable[[], Awaitable[tuple[bool, str]]]) -> HealthCheck:
    started = time.perf_counter()
    try:
        ok, detail = await check()
    except Exception as error:  # any failure is the answer: the check says what it was
        first = (str(error).strip().splitlines() or [""])[0][:200]
        ok, detail = False, f"{type(error).__name__}: {first}"
        log.warning("health check %s failed: %s", name, detail)
    elapsed = round((time.perf_counter() - started) * 1000, 1)
    return HealthCheck(name=name, ok=ok, detail=detail, duration_ms=elapsed)
