"""What `orderctl`'s operator commands need from a backend: the operator operations.

Two implementations: :class:`orderctl.local.LocalOperations`, in process on the running
local stack, and :class:`orderctl.remote.RemoteOperations`, over the operator HTTP API (remote
mode). Both return the API's own models (:mod:`service.operations.models`) and refuse with an
:class:`service.operations.errors.OperatorError`, so each command has one code path for both.

The models are imported for type checking only: this module is loaded on every `orderctl`
start, and they pull in the Azure SDKs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from service.operations.bulk import BulkAction
    from service.operations.models import (
        AckView,
        ActionView,
        AlertPage,
        ArchivedOrderView,
        BulkView,
        DeadLetterActionView,
        DeadLetterLogView,
        DeadLetterPage,
        DeadLetterSummary,
        HealthView,
        OrderDetail,
        OrderPage,
        PurgeRunsView,
        PurgeView,
        SupervisorView,
        WatchView,
    )


class OperatorBackend(Protocol):
    """The operator operations as `orderctl` calls them, each a coroutine (``operator``: who
    acts; over HTTP the API records the caller it authenticated instead)."""

    async def show_order(self, order_id: str) -> OrderDetail: ...

    async def watch_order(self, order_id: str, *, after_seq: int, wait_s: float) -> WatchView: ...

    async def list_orders(
        self,
        state: str,
        *,
        step: str | None,
        older_than: str | None,
        newer_than: str | None,
        text: str | None,
        sort: str | None,
        limit: int,
        continuation: str | None,
    ) -> OrderPage: ...

    async def list_alerts(self, *, limit: int, open_only: bool = False) -> AlertPage: ...

    async def acknowledge_alert(
        self, sequence_number: int, *, operator: str, reason: str | None = None
    ) -> AckView: ...

    async def resubmit(self, order_id: str, *, operator: str, reason: str) -> ActionView: ...

    async def cancel(self, order_id: str, *, operator: str, reason: str) -> ActionView: ...

    async def restart(
        self, order_id: str, *, step: str, operator: str, reason: str
    ) -> ActionView: ...

    async def bulk(
        self,
        action: BulkAction,
        *,
        operator: str,
        reason: str | None,
        state: str | None = None,
        step: str | None = None,
        older_than: str | None = None,
        newer_than: str | None = None,
        text: str | None = None,
        dry_run: bool = False,
        order_ids: Sequence[str] | None = None,
        limit: int = 100,
    ) -> BulkView: ...

    async def supervisor(self) -> SupervisorView: ...

    async def purge(
        self,
        *,
        operator: str,
        state: str = "all",
        older_than_days: int | None = None,
        dry_run: bool = False,
        limit: int = 1000,
    ) -> PurgeView: ...

    async def purge_runs(self, *, limit: int = 20) -> PurgeRunsView: ...

    async def archived_order(
        self, order_id: str, *, day: str | None = None
    ) -> ArchivedOrderView: ...

    async def dead_letter_summary(self) -> DeadLetterSummary: ...

    async def list_dead_letters(self, queue: str) -> DeadLetterPage: ...

    async def replay_dead_letters(
        self,
        queue: str,
        *,
        operator: str,
        sequence_numbers: Sequence[int] | None = None,
        everything: bool = False,
        dry_run: bool = False,
        reason: str | None = None,
    ) -> DeadLetterActionView: ...

    async def purge_dead_letters(
        self,
        queue: str,
        *,
        operator: str,
        sequence_numbers: Sequence[int] | None = None,
        everything: bool = False,
        dry_run: bool = False,
        reason: str | None = None,
    ) -> DeadLetterActionView: ...

    async def dead_letter_log(self, *, limit: int = 20) -> DeadLetterLogView: ...

    async def health(self) -> HealthView: ...

    async def close(self) -> None: ...
