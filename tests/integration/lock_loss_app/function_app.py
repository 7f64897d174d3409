"""A FunctionApp for the lock-loss tests (tests/integration/test_lock_loss.py).

``on_message`` (queue ``%LOCK_TEST_QUEUE%``, ``async def`` as the app's functions are)
records every delivery, then, for a body ``hold:<seconds>``, sleeps that long on the message's
first delivery only, so a redelivery is handled at once. Records go to ``RECORDS`` and, when
the environment names ``LOCK_TEST_RECORD_FILE``, to that file as JSON lines (for hosts running
as separate processes).
"""

from __future__ import annotations

import asyncio
import json
import os

import azure.functions as func

RECORDS: list[dict] = []

app = func.FunctionApp()


def _record(entry: dict) -> None:
    RECORDS.append(entry)
    path = os.environ.get("LOCK_TEST_RECORD_FILE")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(entry) + "\n")


@app.service_bus_queue_trigger(
    arg_name="msg", queue_name="%LOCK_TEST_QUEUE%", connection="ServiceBusConnection"
)
async def on_message(msg: func.ServiceBusMessage) -> None:
    body = msg.get_body().decode("utf-8")
    _record({"body": body, "delivery_count": msg.delivery_count, "pid": os.getpid()})
    if body.startswith("hold:") and msg.delivery_count == 1:
        await asyncio.sleep(float(body.split(":", 1)[1]))
