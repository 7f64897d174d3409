"""The kinds of value an app setting holds: how each is read from its text, and its refusals.

Each kind is a pydantic validator for a field of the settings model (:mod:`adapters.settings`;
the retention purge's own kinds are in :mod:`adapters.retention_settings`), whose fields are
named as the settings are, so a refusal names its setting and says what is
expected. A blank setting is unset (the field's default); any other text is a value, and one
outside what the app can honour is refused, never rounded, clamped or taken for unset.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal, InvalidOperation
from typing import Any

from pydantic import BeforeValidator, ValidationInfo
from pydantic_core import PydanticCustomError, PydanticUseDefault

from domain import ids
from domain.workflows import WORKFLOWS, workflow_ref


class SettingsError(ValueError):
    """A setting is missing or malformed; the message names it and says what is expected."""


MILLISECOND = Decimal("0.001")
"""The finest a duration may be given: the app keeps its times to the millisecond (Service Bus
schedules a message to it), so a finer value could only be rounded, a tiny one to zero."""


def refusal(problem: str) -> PydanticCustomError:
    """A validation error whose message is ``problem`` as written (no prefix, braces kept)."""
    return PydanticCustomError("app_setting", "{problem}", {"problem": problem})


def reader(read: Callable[[str, str], Any]) -> BeforeValidator:
    """A field validator that reads the setting's text with ``read(text, setting)``.

    Blank text is unset: the field takes its default (or is reported missing). A value that is
    not text is the field's default, already what the field holds. A ValueError refuses the
    value; its message is the refusal, prefixed with the setting when it does not name it.
    """

    def validate(value: object, info: ValidationInfo) -> Any:
        setting = info.field_name or "app setting"
        if not isinstance(value, str):
            return value
        text = value.strip()
        if not text:
            raise PydanticUseDefault
        try:
            return read(text, setting)
        except ValueError as problem:
            message = str(problem)
            raise refusal(message if setting in message else f"{setting}: {message}") from None

    return BeforeValidator(validate)


@dataclass(frozen=True)
class Seconds:
    """A duration given in seconds, from ``0`` (if ``zero``) or one millisecond to ``most``.

    ``why`` says why ``most`` is the most (what the app could not honour above it)."""

    most: timedelta
    why: str
    zero: bool = False

    def __call__(self, text: str, setting: str) -> timedelta:
        least = "0" if self.zero else "0.001"
        most = seconds_text(self.most)
        try:
            value = Decimal(text) if text.isascii() else Decimal("NaN")
        except InvalidOperation:
            value = Decimal("NaN")
        if not value.is_finite():
            raise SettingsError(
                f"{setting} must be a number of seconds from {least} to {most}, got {text!r}"
            )
        if value < 0 or (value == 0 and not self.zero):
            limit = "zero or more" if self.zero else "positive"
            raise SettingsError(f"{setting} must be {limit} seconds, got {text!r}")
        if value > Decimal(most):
            raise SettingsError(
                f"{setting} must be at most {most} seconds, got {text!r}: {self.why}"
            )
        if value % MILLISECOND:
            rounded = (
                "less than a millisecond: it would be rounded to 0"
                if value < MILLISECOND
                else "finer than a millisecond: it would be rounded"
            )
            raise SettingsError(
                f"{setting} must be a whole number of milliseconds, from {least} to {most} "
                f"seconds; got {text!r}, {rounded}. The app keeps its times to the millisecond, "
                "as Service Bus schedules messages"
            )
        return timedelta(milliseconds=int(value * 1000))


def seconds_text(duration: timedelta) -> str:
    """``270``, ``1209600``, ``0.5``: seconds as a setting gives them."""
    return f"{duration.total_seconds():.3f}".rstrip("0").rstrip(".")


@dataclass(frozen=True)
class WholeNumber:
    """A whole number (ASCII digits only) from ``least`` to ``most``; ``why`` says why not more.

    ``unit`` names what is counted (``" of days"``), ``zero`` what 0 means where it is allowed.
    """

    least: int
    most: int
    why: str
    unit: str = ""
    zero: str = ""

    def __call__(self, text: str, setting: str) -> int:
        least = f"{self.least} ({self.zero})" if self.zero else str(self.least)
        expected = f"{setting} must be a whole number{self.unit} from {least} to {self.most}"
        if not re.fullmatch(r"[0-9]{1,18}", text, re.ASCII):
            too_long = re.fullmatch(r"[0-9]+", text, re.ASCII) is not None
            why = f": {self.why}" if too_long else ""
            raise SettingsError(f"{expected}, got {text[:40]!r}{why}")
        number = int(text)
        if number < self.least:
            raise SettingsError(f"{expected}, got {text!r}")
        if number > self.most:
            raise SettingsError(f"{expected}, got {text!r}: {self.why}")
        return number


_UNITS = ((1, 60), (60, 60), (3600, 24))
"""(seconds, cycle) of the seconds, minutes and hours fields."""


def schedule_period(schedule: str) -> timedelta:
    """The fixed interval of a six-field NCRONTAB schedule such as ``*/15 * * * * *``.

    The Supervisor's recovery bound and its leases are stated in periods, so only schedules
    that fire at a fixed interval are accepted: a step (``*/N``, N dividing the unit) or ``*``
    in the seconds, minutes or hours field, whole numbers in the fields before it, ``*`` after.
    """
    fields = schedule.split()
    problem = (
        f"SUPERVISOR_SCHEDULE must fire at a fixed interval, e.g. '*/15 * * * * *' (every 15 s) "
        f"or '0 */5 * * * *' (every 5 min); got {schedule!r}"
    )
    if len(fields) != 6 or fields[3:] != ["*", "*", "*"]:
        raise SettingsError(problem)
    for position, (seconds, cycle) in enumerate(_UNITS):
        field = fields[position]
        if field.isascii() and field.isdigit():
            continue
        match = re.fullmatch(r"(?:\*|0)/(\d+)|\*", field, re.ASCII)
        step = int(match.group(1)) if match and match.group(1) else 1
        later_fixed = fields[position + 1 : 3] != ["*"] * (2 - position)
        if match is None or step < 1 or cycle % step or later_fixed:
            raise SettingsError(problem)
        return timedelta(seconds=seconds * step)
    return timedelta(days=1)


def fixed_interval(text: str, setting: str) -> str:
    schedule_period(text)
    return text


def entity_name(text: str, setting: str) -> str:
    return ids.validate_entity_name(text, setting)


def table_name(text: str, setting: str) -> str:
    return ids.validate_table_name(text)


def http_url(text: str, setting: str) -> str:
    if not text.startswith(("http://", "https://")):
        raise SettingsError(f"{setting} must be an http(s) URL, got {text!r}")
    return text


def plain(text: str, setting: str) -> str:
    return text


def workflow_versions(text: str, setting: str) -> dict[str, int]:
    """``order=2,single_step=1``: each a workflow this deployment carries, at a version it
    carries (so a typo fails the start, not the first order)."""
    versions: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        workflow, _, version = part.partition("=")
        digits = version.isascii() and version.isdigit() and len(version) <= 4
        ref = workflow_ref(workflow.strip(), int(version)) if digits else None
        if ref is None or ref not in WORKFLOWS:
            raise SettingsError(
                f"{setting}: {part[:80]!r} is not NAME=VERSION of a workflow this deployment "
                f"carries; known: {', '.join(WORKFLOWS)}"
            )
        versions[workflow.strip()] = int(version)
    return versions
