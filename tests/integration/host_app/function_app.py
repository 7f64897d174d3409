"""A tiny FunctionApp for the local host's tests.

``on_message`` (queue ``%HOST_TEST_QUEUE%``) notes the body in ``STARTED``, acts on it
(``fail...`` raises, ``sleep:<seconds>`` sleeps, ``wait`` blocks until ``RELEASE`` is set),
then records the delivery in ``RECORDS``, whether it raised or not.
``on_message_async`` (queue ``%HOST_TEST_ASYNC_QUEUE%``) is the same as a coroutine function.
``on_timer`` (schedule ``%HOST_TEST_SCHEDULE%``) records each run and sleeps ``TIMER_SLEEP``.
``on_startup`` runs once at startup (its schedule is yearly).

Tests load this module under a fresh name each time (a FunctionApp may be indexed once) and
read the module-level records. When the environment names ``HOST_TEST_RECORD_FILE``, each
delivery is also appended there as a JSON line (for hosts running as separate processes).
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time

import azure.functions as func

bp = func.Blueprint()

STARTED: list[str] = []
RECORDS: list[dict] = []
TIMER_RUNS: list[dict] = []
STARTUP_RUNS: list[dict] = []
RELEASE = threading.Event()
TIMER_SLEEP = 0.0
_lock = threading.Lock()
_active = 0
max_active = 0


def _record(entry: dict) -> None:
    with _lock:
        RECORDS.append(entry)
    path = os.environ.get("HOST_TEST_RECORD_FILE")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(entry) + "\n")


@bp.service_bus_queue_trigger(
    arg_name="msg", queue_name="%HOST_TEST_QUEUE%", connection="ServiceBusConnection"
)
def on_message(msg: func.ServiceBusMessage) -> None:
    global _active, max_active
    body = msg.get_body().decode("utf-8")
    with _lock:
        STARTED.append(body)
        _active += 1
        max_active = max(max_active, _active)
    started = time.monotonic()
    try:
        if body.startswith("fail"):
            raise RuntimeError(f"asked to fail: {body}")
        if body.startswith("sleep:"):
            time.sleep(float(body.split(":", 1)[1]))
        if body == "wait":
            RELEASE.wait(30)
    finally:
        with _lock:
            _active -= 1
        _record(
            {
                "body": body,
                "message_id": msg.message_id,
                "delivery_count": msg.delivery_count,
                "properties": msg.application_properties,
                "started": started,
                "ended": time.monotonic(),
                "pid": os.getpid(),
                "thread": threading.current_thread().name,
            }
        )


@bp.service_bus_queue_trigger(
    arg_name="msg", queue_name="%HOST_TEST_ASYNC_QUEUE%", connection="ServiceBusConnection"
)
async def on_message_async(msg: func.ServiceBusMessage) -> None:
    body = msg.get_body().decode("utf-8")
    STARTED.append(body)
    started = time.monotonic()
    try:
        if body.startswith("fail"):
            raise RuntimeError(f"asked to fail: {body}")
        if body.startswith("sleep:"):
            await asyncio.sleep(float(body.split(":", 1)[1]))
        if body == "wait":
            while not RELEASE.is_set() and time.monotonic() - started < 30:
                await asyncio.sleep(0.02)
    finally:
        _record(
            {
                "body": body,
                "message_id": msg.message_id,
                "delivery_count": msg.delivery_count,
                "started": started,
                "ended": time.monotonic(),
                "thread": threading.current_thread().name,
            }
        )


@bp.timer_trigger(arg_name="timer", schedule="%HOST_TEST_SCHEDULE%", run_on_startup=False)
def on_timer(timer: func.TimerRequest) -> None:
    started = time.monotonic()
    time.sleep(TIMER_SLEEP)
    TIMER_RUNS.append(
        {
            "past_due": timer.past_due,
            "started": started,
            "ended": time.monotonic(),
            "thread": threading.current_thread().name,
        }
    )


@bp.timer_trigger(arg_name="timer", schedule="0 0 0 1 1 *", run_on_startup=True, use_monitor=False)
async def on_startup(timer: func.TimerRequest, context: func.Context) -> None:
    STARTUP_RUNS.append(
        {
            "past_due": timer.past_due,
            "function": context.function_name,
            "next": timer.schedule_status,
            "thread": threading.current_thread().name,
        }
    )


app = func.FunctionApp()
app.register_functions(bp)
