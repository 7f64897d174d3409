"""The operations app's composition root (see :mod:`service.composition`): the Runtime, the
operator context every request of the operator API shares, and the dashboard's overview
summary, whose caches serve every browser. operations_app.py builds it once per process and the
FastAPI app hands it to its routes (:func:`operator_api.app.build`); a test builds its own."""

from __future__ import annotations

from adapters.settings import Settings
from service.composition import Root
from service.operations.context import OperatorContext
from service.operations.summary import Summary


class OperationsRoot(Root):
    def __init__(self, settings: Settings | None = None, **overrides: object) -> None:
        super().__init__(settings, **overrides)
        self._context: OperatorContext | None = None
        self.summary = Summary(self.runtime)

    async def context(self) -> OperatorContext:
        """The operator API's context, made on first use: its clients belong to the event loop
        the requests run on (it awaits nothing before it is kept, so the requests on the loop
        never make two)."""
        rt = self.runtime()
        with self._lock:
            if self._context is None:
                self._context = OperatorContext(rt)
            return self._context

    async def close(self) -> None:
        await self.summary.close()
        with self._lock:
            context, self._context = self._context, None
        if context is not None:
            await context.close()
        await super().close()
