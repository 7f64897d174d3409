"""Calling a user function the way the Functions host and the Python worker do: sync or async,
with ``context``, inside the host's invocation span.

As the Python worker does, a coroutine function is awaited on the host's one event loop
(:meth:`Invoker.call_async`), and a sync function runs on a thread, never on the loop: a daemon
thread of the runner that calls it (:class:`SyncCalls`), or an HTTP request's own thread.

Telemetry, as in Azure (docs/deploy.md, "Telemetry"): the host starts one span per invocation of
a Service Bus or HTTP trigger (the triggers its OpenTelemetry output covers; a timer run gets
none), named after the function and parented on the trace context the message or request
carries (``traceparent``, else ``Diagnostic-Id``). It hands that span's context to the worker as
``context.trace_context``, and the worker makes it the current context for the call when
PYTHON_ENABLE_OPENTELEMETRY is true, so the app's spans are its children. Off, the invocation
span is still recorded and the app's spans are its siblings under the sender. The setting is
read from the host's settings; absent, it is on, as infra/ deploys this app.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import uuid
from collections.abc import Awaitable, Callable, Iterator, Mapping
from concurrent.futures import Future
from contextlib import contextmanager
from typing import Any

import azure.functions as func
from azure.functions._abc import RetryContext, TraceContext
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from adapters.telemetry import WORKER_SWITCH_SETTING, extract
from devstack.host.cold_start import ColdStarts
from devstack.host.indexing import HttpTrigger, IndexedFunction, ServiceBusTrigger

INVOCATION_KINDS: Mapping[type, SpanKind] = {
    ServiceBusTrigger: SpanKind.CONSUMER,
    HttpTrigger: SpanKind.SERVER,
}
FAAS_TRIGGER: Mapping[type, str] = {ServiceBusTrigger: "pubsub", HttpTrigger: "http"}

_tracer = trace.get_tracer("devstack.host")
_propagator = TraceContextTextMapPropagator()


def worker_telemetry(settings: Mapping[str, str]) -> bool:
    """Whether the worker makes the invocation's context current (PYTHON_ENABLE_OPENTELEMETRY;
    absent: true, as this app is deployed)."""
    return settings.get(WORKER_SWITCH_SETTING, "true").strip().lower() in ("true", "1")


class LocalTraceContext(TraceContext):
    def __init__(self, trace_parent: str, trace_state: str) -> None:
        self._trace_parent = trace_parent
        self._trace_state = trace_state

    @property
    def trace_parent(self) -> str:
        return self._trace_parent

    @property
    def trace_state(self) -> str:
        return self._trace_state

    @property
    def attributes(self) -> dict[str, str]:
        return {}


class LocalRetryContext(RetryContext):
    """No retry policy applies (they do not apply to Service Bus triggers anyway)."""

    @property
    def retry_count(self) -> int:
        return 0

    @property
    def max_retry_count(self) -> int:
        return 0

    @property
    def exception(self) -> Any:
        return None


class LocalContext(func.Context):
    """``context``: the invocation's id, and the host's invocation span as its trace context."""

    def __init__(
        self,
        function: IndexedFunction,
        invocation_id: str,
        span: Span | None = None,
        carrier: Mapping[str, Any] | None = None,
    ) -> None:
        self._invocation_id = invocation_id
        self._function = function
        self._trace = _trace_context(span, carrier or {})
        self._local = threading.local()
        self._local.invocation_id = self._invocation_id

    @property
    def invocation_id(self) -> str:
        return self._invocation_id

    @property
    def thread_local_storage(self) -> Any:
        return self._local

    @property
    def function_name(self) -> str:
        return self._function.name

    @property
    def function_directory(self) -> str:
        return self._function.directory

    @property
    def trace_context(self) -> TraceContext:
        return self._trace

    @property
    def retry_context(self) -> RetryContext:
        return LocalRetryContext()


def _trace_context(span: Span | None, carrier: Mapping[str, Any]) -> LocalTraceContext:
    """The invocation span's context; with no span (nothing records), the message's."""
    if span is None:
        parent = carrier.get("traceparent") or carrier.get("Diagnostic-Id") or ""
        return LocalTraceContext(str(parent), str(carrier.get("tracestate") or ""))
    injected: dict[str, str] = {}
    _propagator.inject(injected, context=trace.set_span_in_context(span))
    return LocalTraceContext(injected.get("traceparent", ""), injected.get("tracestate", ""))


class Invoker:
    """Runs user functions; coroutine functions share one event loop on its own thread.

    One loop for all async functions, like the Python worker, so clients an async function
    creates once and reuses stay on the loop they were made on.
    """

    def __init__(
        self, cold_starts: ColdStarts | None = None, *, worker_telemetry: bool = True
    ) -> None:
        self.cold_starts = cold_starts or ColdStarts({})
        self.worker_telemetry = worker_telemetry
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def call(
        self, function: IndexedFunction, trigger_value: Any, trace: Mapping[str, Any] | None = None
    ) -> Any:
        """Run sync ``function`` on ``trigger_value``, on the calling thread (never the loop's);
        ``trace``: the message's application properties or the request's headers (lower-case
        names), where its trace context is."""
        self.cold_starts.wait(function.name)
        invocation_id = str(uuid.uuid4())
        with self._invocation(function, invocation_id, trace) as span:
            return function.user_function(
                **self._arguments(function, trigger_value, trace, span, invocation_id)
            )

    async def call_async(
        self, function: IndexedFunction, trigger_value: Any, trace: Mapping[str, Any] | None = None
    ) -> Any:
        """:meth:`call` for a coroutine function, awaited on the loop it is called on (this
        invoker's): how the Python worker runs an async function, with no thread hop."""
        if self.cold_starts.applies(function.name):
            await asyncio.to_thread(self.cold_starts.wait, function.name)
        invocation_id = str(uuid.uuid4())
        with self._invocation(function, invocation_id, trace) as span:
            return await function.user_function(
                **self._arguments(function, trigger_value, trace, span, invocation_id)
            )

    @staticmethod
    def _arguments(
        function: IndexedFunction,
        trigger_value: Any,
        trace: Mapping[str, Any] | None,
        span: Span | None,
        invocation_id: str,
    ) -> dict[str, Any]:
        kwargs = {function.trigger_param: trigger_value}
        if function.wants_context:
            kwargs["context"] = LocalContext(function, invocation_id, span, trace)
        return kwargs

    @contextmanager
    def _invocation(
        self, function: IndexedFunction, invocation_id: str, carrier: Mapping[str, Any] | None
    ) -> Iterator[Span | None]:
        """The host's span for one invocation (none for a timer), current during the call when
        the worker switch is on; failed when the function raises. None, too, while no tracer
        provider is installed: a span nothing records would only cost time, and the app's spans
        follow the message's context the same without it."""
        kind = INVOCATION_KINDS.get(type(function.trigger))
        if kind is None or isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
            yield None
            return
        span = _tracer.start_span(
            function.name,
            context=extract(carrier),
            kind=kind,
            attributes={
                "faas.trigger": FAAS_TRIGGER[type(function.trigger)],
                "faas.invocation_id": invocation_id,
            },
        )
        try:
            if self.worker_telemetry:
                with trace.use_span(span, record_exception=False, set_status_on_exception=False):
                    yield span
            else:
                yield span
        except BaseException as error:
            span.record_exception(error)
            span.set_status(Status(StatusCode.ERROR, type(error).__name__))
            raise
        finally:
            span.end()

    def run(self, awaitable: Awaitable[Any], timeout: float | None) -> Any:
        """Await ``awaitable`` on the async functions' loop, from another thread."""
        return self.submit(awaitable).result(timeout)

    def submit(self, awaitable: Awaitable[Any]) -> Future[Any]:
        """Start awaiting ``awaitable`` on the async functions' loop, from another thread."""
        return asyncio.run_coroutine_threadsafe(_awaited(awaitable), self._event_loop())

    def call_soon(self, callback: Callable[[], object]) -> None:
        """Have the async functions' loop call ``callback``, from another thread."""
        self._event_loop().call_soon_threadsafe(callback)

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                self._thread = threading.Thread(
                    target=loop.run_forever, name="host-async-loop", daemon=True
                )
                self._thread.start()
                self._loop = loop
            return self._loop

    def close(self, timeout: float = 2.0) -> None:
        """Cancel what still runs on the loop, stop it, and join its thread."""
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is None or thread is None:
            return

        async def cancel_all() -> None:
            current = asyncio.current_task()
            for task in asyncio.all_tasks():
                if task is not current:
                    task.cancel()

        try:
            asyncio.run_coroutine_threadsafe(cancel_all(), loop).result(timeout)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout)
            if not thread.is_alive():
                loop.close()


async def _awaited(awaitable: Awaitable[Any]) -> Any:
    """``awaitable`` as a coroutine (what run_coroutine_threadsafe takes)."""
    return await awaitable


_Call = tuple[Callable[[], Any], asyncio.AbstractEventLoop, "asyncio.Future[Any]"]
"""A sync call for a runner's thread: the call, and the loop and future that await it."""


class SyncCalls:
    """A daemon thread that runs one runner's sync function calls, one at a time, each awaited
    on the loop (as the Python worker runs a sync function on its thread pool).

    Daemon, so that a run still going past the host's stop deadline is left to end on its own
    and never holds up the process's exit (a pool's threads would be joined at exit)."""

    def __init__(self, name: str) -> None:
        self._calls: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        self.busy = False
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    async def call(self, fn: Callable[[], Any]) -> Any:
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        self._calls.put((fn, loop, done))
        return await done

    def _run(self) -> None:
        while (item := self._calls.get()) is not None:
            fn, loop, done = item
            self.busy = True
            try:
                result, error = fn(), None
            except BaseException as failure:
                result, error = None, failure
            finally:
                self.busy = False
            with contextlib.suppress(RuntimeError):  # the loop has closed: nobody waits now
                loop.call_soon_threadsafe(_resolve, done, result, error)

    def close(self) -> None:
        """End the thread once its call in progress, if any, has returned."""
        self._calls.put(None)
        if not self.busy:
            self.thread.join(1.0)


def _resolve(done: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if done.cancelled():
        return
    if error is not None:
        done.set_exception(error)
    else:
        done.set_result(result)
