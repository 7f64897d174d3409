"""Calling a user function the way the Python worker does: sync or async, with ``context``."""

from __future__ import annotations

import asyncio
import inspect
import threading
import uuid
from collections.abc import Mapping
from concurrent.futures import Future
from typing import Any

import azure.functions as func
from azure.functions._abc import RetryContext, TraceContext

from devstack.host.cold_start import ColdStarts
from devstack.host.indexing import IndexedFunction


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
    def __init__(self, function: IndexedFunction, trace: Mapping[str, Any] | None = None) -> None:
        self._invocation_id = str(uuid.uuid4())
        self._function = function
        trace = trace or {}
        parent = trace.get("traceparent") or trace.get("Diagnostic-Id") or ""
        self._trace = LocalTraceContext(str(parent), str(trace.get("tracestate") or ""))
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


class Invoker:
    """Runs user functions; coroutine functions share one event loop on its own thread.

    One loop for all async functions, like the Python worker, so clients an async function
    creates once and reuses stay on the loop they were made on.
    """

    def __init__(self, cold_starts: ColdStarts | None = None) -> None:
        self.cold_starts = cold_starts or ColdStarts({})
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def call(
        self, function: IndexedFunction, trigger_value: Any, trace: Mapping[str, Any] | None = None
    ) -> Any:
        self.cold_starts.wait(function.name)
        kwargs = {function.trigger_param: trigger_value}
        if function.wants_context:
            kwargs["context"] = LocalContext(function, trace)
        result = function.user_function(**kwargs)
        if inspect.isawaitable(result):
            future: Future[Any] = asyncio.run_coroutine_threadsafe(
                _awaited(result), self._event_loop()
            )
            result = future.result()
        return result

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


async def _awaited(awaitable: Any) -> Any:
    return await awaitable
