"""benchmarks.cpu_split: fixed py-spy stacks of a function host, each put in the part it belongs
to (what deploys, the development host, shared, idle), and a host's CPU divided by them."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks.cpu_split import Frame, Samples, Split, attribute, classify

ROOT = "/repo/"
PY = "/usr/lib/python3.11/"
SITE = "/repo/.venv/lib/python3.11/site-packages/"

LOOP = [
    f"Thread.run ({PY}threading.py:982)",
    f"BaseEventLoop.run_forever ({PY}asyncio/base_events.py:607)",
    f"BaseEventLoop._run_once ({PY}asyncio/base_events.py:1922)",
    f"Handle._run ({PY}asyncio/events.py:80)",
]
SLOT = [
    *LOOP,
    f"_Slot.run ({ROOT}devstack/host/servicebus_runner.py:291)",
    f"_Slot.process ({ROOT}devstack/host/servicebus_runner.py:318)",
]
INVOKE = [
    *SLOT,
    f"_Slot._invoke ({ROOT}devstack/host/servicebus_runner.py:334)",
    f"Invoker.call_async ({ROOT}devstack/host/invoke.py:179)",
]
REPLY = [
    *INVOKE,
    f"scheduler_replies ({ROOT}scheduler/functions.py:58)",
    f"on_reply ({ROOT}scheduler/functions.py:40)",
    f"handle_response ({ROOT}service/replies.py:33)",
]


def stack(*frames: str) -> list[Frame]:
    return [Frame.parse(text) for text in frames]


def case(why: str, expected: tuple[str, str], *frames: str) -> Any:
    """A stack (outermost frame first) and the part and kind of work it is counted as."""
    return pytest.param(list(frames), expected, id=why)


CASES = [
    case(
        "a reply's Table write",
        ("deploys", "Table requests"),
        *REPLY,
        f"carry_out ({ROOT}service/apply.py:200)",
        f"OrderStateStore.save ({ROOT}adapters/store/state_store.py:90)",
        f"Table.submit_transaction ({ROOT}adapters/tables/client.py:200)",
        f"AsyncPipeline.run ({SITE}azure/core/pipeline/_base_async.py:220)",
    ),
    case(
        "the app's send, runnable in its write: the reader woken has the CPU",
        ("idle", "runnable after a send"),
        *REPLY,
        f"send ({ROOT}service/apply.py:240)",
        f"Bus.send ({ROOT}adapters/servicebus.py:57)",
        f"ServiceBusSender.send_messages ({SITE}azure/servicebus/aio/_sender.py:1)",
        f"_SelectorSocketTransport.write ({PY}asyncio/selector_events.py:1040)",
    ),
    case(
        "parsing a reply",
        ("deploys", "validation and encoding"),
        *REPLY,
        f"parse_message ({ROOT}domain/messages.py:640)",
        f"BaseModel.model_validate ({SITE}pydantic/main.py:1)",
    ),
    case(
        "restoring the snapshot",
        ("deploys", "snapshot"),
        *REPLY,
        f"restore ({ROOT}service/resume.py:90)",
        f"loads ({PY}json/__init__.py:346)",
    ),
    case(
        "logging is counted where it is paid",
        ("deploys", "logging"),
        *REPLY,
        f"Logger.info ({PY}logging/__init__.py:1489)",
        f"Bus.send ({ROOT}adapters/servicebus.py:57)",
    ),
    case(
        "the host's conversion to func.ServiceBusMessage",
        ("dev_host", "conversion"),
        *SLOT,
        f"_Slot._invoke ({ROOT}devstack/host/servicebus_runner.py:330)",
        f"to_function_message ({ROOT}devstack/host/servicebus_runner.py:180)",
        f"ServiceBusMessage.__init__ ({SITE}azure/functions/servicebus.py:40)",
    ),
    case(
        "the invoker's own work under its call is not the function's",
        ("dev_host", "host other"),
        *INVOKE,
        f"uuid4 ({PY}uuid.py:723)",
    ),
    case(
        "the host's invocation span",
        ("dev_host", "invocation span"),
        *INVOKE,
        f"_GeneratorContextManager.__exit__ ({PY}contextlib.py:144)",
        f"Invoker._invocation ({ROOT}devstack/host/invoke.py:230)",
    ),
    case(
        "the host's receive, runnable in its write",
        ("idle", "runnable after a send"),
        *LOOP,
        f"_Slot.run ({ROOT}devstack/host/servicebus_runner.py:272)",
        f"ServiceBusReceiver.receive_messages ({SITE}azure/servicebus/aio/_receiver.py:702)",
        f"_SelectorSocketTransport.write ({PY}asyncio/selector_events.py:1040)",
    ),
    case(
        "the host's settlement",
        ("dev_host", "settle"),
        *SLOT,
        f"_Slot._settle ({ROOT}devstack/host/servicebus_runner.py:360)",
        f"ServiceBusReceiver.complete_message ({SITE}azure/servicebus/aio/_receiver.py:800)",
    ),
    case(
        "the lock renewer's task has no host frame but is the host's",
        ("dev_host", "lock renewal"),
        *LOOP,
        f"AutoLockRenewer._auto_lock_renew ({SITE}azure/servicebus/aio/_autolock.py:90)",
    ),
    case(
        "a task the app started",
        ("deploys", "Table requests"),
        *LOOP,
        f"_gather.<locals>.one ({ROOT}service/sweep.py:234)",
        f"TableService.request ({ROOT}adapters/tables/client.py:135)",
    ),
    case(
        "aiohttp's writer task: only the app makes HTTP requests",
        ("deploys", "HTTP (aiohttp, azure-core)"),
        *LOOP,
        f"ClientRequest.write_bytes ({SITE}aiohttp/client_reqrep.py:1594)",
    ),
    case(
        "an AMQP read in a task of its own names no owner",
        ("shared", "Service Bus connection reads"),
        *LOOP,
        f"AsyncTransportMixin.read ({SITE}azure/servicebus/_pyamqp/aio/_transport_async.py:90)",
    ),
    case(
        "the loop's own work",
        ("shared", "event loop"),
        *LOOP,
        f"_SelectorSocketTransport._read_ready ({PY}asyncio/selector_events.py:950)",
    ),
    case(
        "a runnable thread still in select is not at work",
        ("idle", "waiting"),
        *LOOP[:3],
        f"EpollSelector.select ({PY}selectors.py:468)",
    ),
    case("an empty stack", ("shared", "cut short")),
]


@pytest.mark.parametrize(("frames", "expected"), CASES)
def test_each_sample_is_put_where_it_belongs(frames: list[str], expected: tuple[str, str]) -> None:
    assert classify(stack(*frames), ROOT) == expected


def test_a_frame_is_read_as_py_spy_writes_it() -> None:
    frame = Frame.parse(f"Handle._run ({PY}asyncio/events.py:80)")
    assert frame == Frame("Handle._run", f"{PY}asyncio/events.py")


def test_each_threads_cpu_is_divided_by_its_own_samples() -> None:
    reply = ";".join(REPLY)
    receive = ";".join(
        [*SLOT[:-1], f"ServiceBusReceiver.receive_messages ({SITE}azure/servicebus/aio/r.py:1)"]
    )
    idle = ";".join([*LOOP[:3], f"EpollSelector.select ({PY}selectors.py:468)"])
    lines = [
        f"thread (11): host-async-loop;{reply} 30",
        f"thread (11): host-async-loop;{receive} 10",
        f"thread (11): host-async-loop;{idle} 60",  # dropped: the loop thread's CPU is 40 samples'
        f"thread (12): MainThread;{receive} 5",
    ]
    samples = Samples.read(lines, ROOT)
    split = attribute(samples, {11: 4.0, 12: 1.0, 13: 0.5}, process_cpu=6.0)
    # Thread 11: 3.0 s and 1.0 s by its samples; thread 12: 1.0 s; thread 13 (no sample) and
    # 0.5 s of threads that ended: 1.0 s by the process's 45 samples (30 reply, 15 receive).
    assert split.part("deploys") == pytest.approx(3.0 + 1.0 * 30 / 45)
    assert split.part("dev_host") == pytest.approx(1.0 + 1.0 + 1.0 * 15 / 45)
    assert split.part("idle") == 0


def test_shared_cpu_is_divided_in_proportion_to_the_parts() -> None:
    split = Split()
    split.add("deploys", "Table requests", 3.0)
    split.add("dev_host", "receive", 1.0)
    split.add("shared", "event loop", 2.0)
    assert split.apportioned() == pytest.approx((4.5, 1.5))
