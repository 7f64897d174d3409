"""What operator operations return, built with chosen text in every stored string field, and
`orderctl` pointed at them: for the CLI's output tests (JSON shapes, hostile text)."""

from __future__ import annotations

import json
import os
from contextlib import asynccontextmanager
from pathlib import Path

from devstack.stack.local_stack import STATE_FILE
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

AT = "2025-03-01T12:00:00Z"


def order_summary(s: str) -> dict:
    return {
        "order_id": "order-7", "workflow": "order", "state": "Error", "generation": 2,
        "attempt": 4, "failure_count": 3, "current_step": "charge_payment",
        "current_operation": "undo", "locked_by": s, "complete_by": AT, "next_attempt_at": AT,
        "last_error": s, "compensation_cause": "cancelled", "compensation_reason": s,
        "reply_to": None, "created_at": AT, "updated_at": AT, "settling": [s],
    }  # fmt: skip


def order_detail(s: str) -> OrderDetail:
    step = {
        "name": "charge_payment", "index": 1, "state": "Failed", "generation": 2, "attempt": 3,
        "result": {"note": s}, "error_code": "declined", "error_message": s,
        "completed_at": AT, "compensated_at": None, "started_at": AT, "duration_s": 1.5,
        "requests": 3, "failures": 2, "deferrals": 1, "reasons": [s],
    }  # fmt: skip
    entry = {
        "seq": 1, "at": AT, "actor": s, "event": "compensation_started",
        "from_state": "Processing", "to_state": "Compensating", "step": "charge_payment",
        "attempt": 3, "detail": s,
    }  # fmt: skip
    return OrderDetail.model_validate(
        {
            "order": order_summary(s),
            "submitted": {"order_id": "order-7", "customer_id": s},
            "steps": [step],
            "timeline": [entry],
            "timeline_continuation": None,
        }
    )


def purge_view(s: str) -> PurgeView:
    return PurgeView.model_validate(
        {
            "run_id": f"run-{s}", "requested_by": s, "dry_run": False, "states": ["Processed"],
            "older_than_days": 7, "cutoff": AT, "started_at": AT, "finished_at": AT,
            "examined": 1, "purgeable": 1, "archived": 1, "purged": 1, "skipped_changed": 0,
            "already_gone": 0, "kept": {s: 1}, "interrupted_finished": 0, "failed": 0,
            "more": False, "blobs": [s],
        }
    )  # fmt: skip


class Ops:
    """Operations returning views full of ``s`` (coroutines, as the real ones)."""

    def __init__(self, s: str) -> None:
        self.s = s

    async def show_order(self, order_id: str) -> OrderDetail:
        return order_detail(self.s)

    async def watch_order(self, order_id: str, *, after_seq: int, wait_s: float) -> WatchView:
        detail = order_detail(self.s)
        if after_seq >= 0:  # the second call: the order is done, nothing new
            detail = detail.model_copy(update={"timeline": []})
        return WatchView(changed=after_seq < 0, terminal=True, detail=detail)

    async def list_orders(self, state, *, step, older_than, newer_than, text, sort, limit,
                    continuation) -> OrderPage:  # fmt: skip
        return OrderPage(
            state="Error",
            sort="-created",
            filters={"text": self.s},
            items=[order_detail(self.s).order],
            continuation=self.s,
            scanned=1,
            partial=True,
        )

    async def bulk(self, action, *, operator, reason, limit, dry_run=False, order_ids=None,
                   **filters):  # fmt: skip
        item = {
            "order_id": "order-7", "order": order_detail(self.s).order.model_dump(),
            "outcome": f"would_{action}" if dry_run else "refused", "detail": self.s,
            "state": None,
        }  # fmt: skip
        return BulkView.model_validate(
            {"action": action, "dry_run": dry_run, "states": ["Error"],
             "filters": {"text": self.s}, "items": [item], "acted": 0, "more": True}
        )  # fmt: skip

    async def restart(self, order_id, *, step, operator, reason) -> ActionView:
        return self._action("restart", "restarted")

    async def replay_dead_letters(self, queue, **options) -> DeadLetterActionView:
        return self._dead_letter_action("replay", queue, options)

    async def purge_dead_letters(self, queue, **options) -> DeadLetterActionView:
        return self._dead_letter_action("purge", queue, options)

    def _dead_letter_action(self, action: str, queue: str, options: dict) -> DeadLetterActionView:
        dry_run = options.get("dry_run", False)
        outcome = f"would_{action}" if dry_run else ("replayed" if action == "replay" else "purged")
        return DeadLetterActionView.model_validate(
            {"action": action, "queue": queue, "entity": self.s, "dry_run": dry_run,
             "more": False,
             "items": [{"sequence_number": 1, "message_id": self.s, "order_id": "order-7",
                        "outcome": outcome, "detail": self.s,
                        "recorded_in_timeline": not dry_run}]}
        )  # fmt: skip

    async def dead_letter_log(self, *, limit) -> DeadLetterLogView:
        s = self.s
        return DeadLetterLogView.model_validate(
            {"actions": [
                {"at": AT, "actor": s, "action": "purge", "queue": "orders", "reason": s,
                 "messages": 2, "counts": {"purged": 1, "refused": 1}, "truncated": True,
                 "outcomes": [
                     {"sequence_number": 1, "message_id": s, "order_id": None,
                      "outcome": "purged"},
                     {"sequence_number": 2, "message_id": None, "order_id": "order-7",
                      "outcome": "refused"}]}]}
        )  # fmt: skip

    async def health(self) -> HealthView:
        return HealthView.model_validate(
            {"status": "ok", "checks": [
                {"name": "table", "ok": True, "detail": self.s, "duration_ms": 1.5}]}
        )  # fmt: skip

    async def list_alerts(self, *, limit, open_only=False) -> AlertPage:
        s = self.s
        alert = {"severity": s, "order_id": s, "reason": s, "detail": s}
        return AlertPage.model_validate(
            {
                "items": [
                    {"sequence_number": 1, "message_id": s, "enqueued_at": AT, "alert": alert,
                     "raw": None, "problem": None, "resolution": "retrying",
                     "order_state": "Pending"},
                    {"sequence_number": 2, "message_id": None, "enqueued_at": None,
                     "alert": None, "raw": s, "problem": s},
                ],
                "continuation": None,
                "open_only": open_only,
            }
        )  # fmt: skip

    async def acknowledge_alert(self, sequence_number, *, operator, reason=None) -> AckView:
        return AckView(
            sequence_number=sequence_number, message_id=self.s, order_id="order-7",
            acknowledged_by=self.s, recorded_in_timeline=True,
        )  # fmt: skip

    async def resubmit(self, order_id, *, operator, reason) -> ActionView:
        return self._action("resubmit", "resubmitted")

    async def cancel(self, order_id, *, operator, reason) -> ActionView:
        return self._action("cancel", "compensating")

    def _action(self, action: str, outcome: str) -> ActionView:
        return ActionView.model_validate(
            {"order_id": "order-7", "action": action, "outcome": outcome, "state": "Pending",
             "step": "charge_payment", "generation": 3, "requested_by": self.s, "detail": self.s}
        )  # fmt: skip

    async def supervisor(self) -> SupervisorView:
        bucket = {
            "bucket": 0, "holder": self.s, "leased_until": AT, "swept_at": AT,
            "swept_by": self.s, "lag_s": 1.5, "due_found": 2, "dispatched": 2, "returned": 0,
            "drain_rate": 0.5, "left": 0,
        }  # fmt: skip
        return SupervisorView.model_validate(
            {
                "lag_s": 1.5, "oldest_sweep_s": 2.0, "unswept_buckets": [3],
                "holders": {self.s: 1}, "buckets": [bucket], "backlog": 2, "left": 0,
                "drain_rate": 0.5, "time_to_drain_s": 4.0, "drains_within_period": True,
                "bound": {"period_s": 15, "budget_s": 11.25, "lease_s": 22.5,
                          "detection_s": 41.25, "stall_s": 90},
            }
        )  # fmt: skip

    async def purge(self, **_) -> PurgeView:
        return purge_view(self.s)

    async def purge_runs(self, *, limit) -> PurgeRunsView:
        return PurgeRunsView(runs=[purge_view(self.s)])

    async def archived_order(self, order_id, *, day) -> ArchivedOrderView:
        return ArchivedOrderView(
            archived_at=AT, run_id=self.s, copies=2, order=order_detail(self.s)
        )

    async def dead_letter_summary(self) -> DeadLetterSummary:
        return DeadLetterSummary.model_validate(
            {"queues": [{"queue": "orders", "entity": "orders", "count": 2, "more": True}]}
        )

    async def list_dead_letters(self, queue) -> DeadLetterPage:
        s = self.s
        return DeadLetterPage.model_validate(
            {
                "queue": queue, "entity": "orders", "continuation": None,
                "items": [
                    {"sequence_number": 1, "message_id": s, "enqueued_at": AT,
                     "delivery_count": 10, "reason": s, "description": s, "subject": s,
                     "body": {"text": s}, "raw": None},
                    {"sequence_number": 2, "message_id": None, "enqueued_at": None,
                     "delivery_count": None, "reason": s, "description": None, "subject": None,
                     "body": None, "raw": s},
                ],
            }
        )  # fmt: skip


def use_ops(monkeypatch, s: str, width: int = 120) -> None:
    from rich.console import Console

    @asynccontextmanager
    async def operations(workdir):
        yield Ops(s)

    monkeypatch.setattr("orderctl.connection.operations", operations)
    monkeypatch.setattr("orderctl.app.console", Console(width=width))


def fake_running_stack(workdir: Path) -> None:
    """A stack.json whose supervisor is this process: `orderctl` sees a running stack."""
    from devstack.stack.local_stack import base_settings

    workdir.mkdir(parents=True, exist_ok=True)
    settings = base_settings() | {
        "ServiceBusConnection": "Endpoint=sb://localhost:1;SharedAccessKeyName=k;"
        "SharedAccessKey=a2V5;UseDevelopmentEmulator=true",
        "StateStorage": "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;"
        "AccountKey=a2V5;BlobEndpoint=http://127.0.0.1:2/devstoreaccount1;"
        "QueueEndpoint=http://127.0.0.1:3/devstoreaccount1;"
        "TableEndpoint=http://127.0.0.1:4/devstoreaccount1;",
    }
    document = {
        "settings": settings,
        "fakes_url": "http://127.0.0.1:5",
        "pids": {"azurite": os.getpid(), "host-0": os.getpid()},
        "api_url": "http://127.0.0.1:7071/api/",
        "logs": {"host-0": str(workdir / "host-0.log")},
        "supervisor_pid": os.getpid(),
        "restarts": {"host-0": 2},
        "persistent": True,
    }
    (workdir / STATE_FILE).write_text(json.dumps(document))
