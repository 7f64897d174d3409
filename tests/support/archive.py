"""Reading a whole day of the archive back, as the tests check it (the app reads one order)."""

from __future__ import annotations

from datetime import date

from adapters.archive import ArchivedOrder
from adapters.archive_reading import ReadableArchive, decode, latest


async def archived_on(archive: ReadableArchive, day: date) -> list[ArchivedOrder]:
    """The orders archived on ``day``, one per order id (de-duplicated), in archive order."""
    records = [
        decode(line) for blob in await archive.blobs(day) async for line in archive.lines(blob)
    ]
    return latest(records)
