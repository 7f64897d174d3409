"""The operations app's composition root (see :mod:`service.composition`): the Runtime, the
archive of purged orders (the retention timer appends to it; the operator API purges into it and
reads it back), the operator context every request of the operator API shares, and the
dashboard's overview summary, whose caches serve every browser. operations_app.py builds it once
per process and hands it to the FastAPI app, which hands it to its routes
(:func:`operator_api.app.build`), and to the retention timer; a test builds its own."""

from __future__ import annotations

from adapters.archive_reading import ReadableBlobArchive
from adapters.retention_settings import RetentionSettings
from adapters.store.records import OrderRecords
from adapters.store.state_store import OrderStateStore
from service.composition import Root
from service.operations.context import OperatorContext
from service.operations.summary import Summary
from service.purge import open_archive


class OperationsRoot(Root):
    store_type: type[OrderStateStore] = OrderRecords

    def __init__(self, settings: RetentionSettings | None = None, **overrides: object) -> None:
        super().__init__(settings, **overrides)
        self._archive: ReadableBlobArchive | None = None
        self._context: OperatorContext | None = None
        self.summary = Summary(self.runtime)

    def read_settings(self) -> RetentionSettings:
        """The operations app's: every app's and the retention purge's."""
        return RetentionSettings.from_env()

    def archive(self) -> ReadableBlobArchive:
        """The archive of the Runtime's storage account, opened on first use: one per process,
        the timer's and the operator API's."""
        rt = self.runtime()
        with self._lock:
            if self._archive is None:
                self._archive = open_archive(rt.settings, ReadableBlobArchive)
            return self._archive

    async def context(self) -> OperatorContext:
        """The operator API's context, made on first use: its clients belong to the event loop
        the requests run on (it awaits nothing before it is kept, so the requests on the loop
        never make two). It purges into and reads the root's archive."""
        rt = self.runtime()
        with self._lock:
            if self._context is None:
                self._context = OperatorContext(rt, archive=self.archive)
            return self._context

    async def close(self) -> None:
        await self.summary.close()
        with self._lock:
            context, self._context = self._context, None
            archive, self._archive = self._archive, None
        if context is not None:
            await context.close()
        if archive is not None:
            await archive.close()
        await super().close()
