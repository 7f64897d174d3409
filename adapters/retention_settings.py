"""The retention purge's settings: the operations app's (the purge's timer, the operator API's
purge and archive reads) and the tools', never the pattern app's, which imports nothing of here.

:class:`RetentionSettings` is :class:`adapters.settings.Settings` and the purge's
(:class:`Retention`), read from :class:`RetentionAppSettings`: the common settings' model and
the purge's, checked together, so a wrong setting of either kind is named in the same
SettingsError when the operations app loads. The pattern app reads
:data:`adapters.settings.AppSettings` alone, so infra/ sets it none of these.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Annotated, Any

from pydantic import Field, ValidationInfo, field_validator

from adapters.setting_values import SettingsError, WholeNumber, plain, reader, refusal
from adapters.settings import (
    STATE_STORAGE_CONNECTION,
    AppSettings,
    AppSettingsBase,
    Connection,
    Settings,
)

DEFAULT_RETENTION_DAYS = 30
DEFAULT_PURGE_SCHEDULE = "0 30 2 * * *"
"""Every day at 02:30 UTC."""
DEFAULT_ARCHIVE_CONTAINER = "order-archive"
MAX_RETENTION_DAYS = 3650

_DAYS = WholeNumber(
    0,
    MAX_RETENTION_DAYS,
    unit=" of days",
    zero="never purge",
    why="ten years is the longest a finished order is kept; 0 keeps it for good",
)
_CRON_FIELD = re.compile(r"[0-9A-Za-z*/,\-]+", re.ASCII)
_CONTAINER = re.compile(r"[a-z0-9](?:[a-z0-9]|-(?=[a-z0-9])){2,62}", re.ASCII)


def ncrontab(text: str, setting: str) -> str:
    """A six-field NCRONTAB schedule (seconds first, UTC), its fields one space apart."""
    fields = text.split()
    if len(fields) != 6 or not all(_CRON_FIELD.fullmatch(field) for field in fields):
        raise SettingsError(
            f"{setting} must be an NCRONTAB schedule of six fields, seconds first, e.g. "
            f"'0 30 2 * * *' (every day at 02:30 UTC); got {text!r}"
        )
    return " ".join(fields)


def container_name(text: str, setting: str) -> str:
    """A Blob container name: 3-63 lowercase letters, digits and single hyphens."""
    if not _CONTAINER.fullmatch(text):
        raise SettingsError(
            f"{setting} must be a blob container name (3-63 lowercase letters, digits and "
            f"single hyphens, starting and ending with a letter or digit); got {text!r}"
        )
    return text


@dataclass(frozen=True, kw_only=True)
class Retention:
    """The retention purge's settings, and where it archives."""

    storage: Connection
    """The state storage account's blob service: its connection string (which names both
    services), or ``StateStorage__blobServiceUri`` reached with the managed identity."""
    days: int = DEFAULT_RETENTION_DAYS
    """Days a finished order (Processed, or Error once resolved) is kept; 0: never purged by
    the timer (operators may still purge on demand)."""
    schedule: str = DEFAULT_PURGE_SCHEDULE
    container: str = DEFAULT_ARCHIVE_CONTAINER
    """The archive's blob container, in the state storage account."""


@dataclass(frozen=True, kw_only=True)
class RetentionSettings(Settings):
    """The operations app's settings: every app's and the retention purge's."""

    retention: Retention

    @classmethod
    def model(cls) -> type[AppSettingsBase]:
        return RetentionAppSettings


def retention_of(settings: Settings) -> Retention:
    """The retention purge's settings, which only :class:`RetentionSettings` hold (a Runtime
    holds its app's settings as :class:`Settings`)."""
    if not isinstance(settings, RetentionSettings):
        raise SettingsError(
            "the retention purge's settings (RETENTION_DAYS, PURGE_SCHEDULE, ARCHIVE_CONTAINER) "
            "were not read: these are the pattern app's settings (Settings), and the purge runs "
            "in the operations app (RetentionSettings)"
        )
    return settings.retention


def purge_schedule(env: Mapping[str, str]) -> str:
    """The purge timer's NCRONTAB schedule (``PURGE_SCHEDULE``: six fields, seconds first, UTC).

    The timer function reads this while the app is indexed (the schedule is part of its
    binding), so a bad value stops the host with this message.
    """
    text = (env.get("PURGE_SCHEDULE", "") or "").strip()
    return ncrontab(text, "PURGE_SCHEDULE") if text else DEFAULT_PURGE_SCHEDULE


class RetentionAppSettings(AppSettings):  # type: ignore[misc,valid-type]
    """:data:`adapters.settings.AppSettings` and the retention purge's: what the operations app
    reads, and the tools."""

    StateStorage__blobServiceUri: Annotated[
        str | None, reader(plain), Field(validate_default=True)
    ] = None
    RETENTION_DAYS: Annotated[int, reader(_DAYS)] = DEFAULT_RETENTION_DAYS
    PURGE_SCHEDULE: Annotated[str, reader(ncrontab)] = DEFAULT_PURGE_SCHEDULE
    ARCHIVE_CONTAINER: Annotated[str, reader(container_name)] = DEFAULT_ARCHIVE_CONTAINER

    @field_validator(f"{STATE_STORAGE_CONNECTION}__blobServiceUri")
    @classmethod
    def _blob_service(cls, value: str | None, info: ValidationInfo) -> str | None:
        storage = info.data.get(STATE_STORAGE_CONNECTION)
        if value or storage is None or storage.connection_string:
            return value  # a connection string names the blob service (or no storage to name)
        name = STATE_STORAGE_CONNECTION
        raise refusal(
            f"{name}__blobServiceUri is not set: with a managed identity the retention purge "
            f"needs the state storage's blob service too (it archives finished orders there), "
            "e.g. https://<account>.blob.core.windows.net/"
        )

    def fields(self) -> dict[str, Any]:
        storage = self.StateStorage
        assert storage is not None  # its validator refuses a state storage not configured
        if storage.connection_string is None:  # the identity's, at the blob service
            storage = replace(storage, endpoint=self.StateStorage__blobServiceUri)
        retention = Retention(
            storage=storage,
            days=self.RETENTION_DAYS,
            schedule=self.PURGE_SCHEDULE,
            container=self.ARCHIVE_CONTAINER,
        )
        return super().fields() | {"retention": retention}
