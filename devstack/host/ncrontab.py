"""NCRONTAB schedules as the Functions timer trigger reads them, on croniter.

Six fields, seconds first (``{second} {minute} {hour} {day} {month} {day-of-week}``), or the
five-field form without seconds. Times are UTC, as on Flex Consumption.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from croniter import CroniterError, croniter


class NcrontabSchedule:
    def __init__(self, expression: str) -> None:
        fields = expression.split()
        if len(fields) not in (5, 6):
            raise ValueError(
                f"{expression!r} is not an NCRONTAB expression: expected 6 fields "
                "({second} {minute} {hour} {day} {month} {day-of-week}) or 5 without seconds, "
                f"got {len(fields)}"
            )
        try:
            croniter(expression, second_at_beginning=True)
        except (CroniterError, ValueError) as error:
            message = f"{expression!r} is not a valid NCRONTAB expression: {error}"
            raise ValueError(message) from None
        self.expression = expression

    def next_after(self, moment: datetime) -> datetime:
        """The first occurrence strictly after ``moment`` (an aware datetime)."""
        return croniter(
            self.expression, moment, second_at_beginning=True, ret_type=datetime
        ).get_next()

    def period_at(self, occurrence: datetime) -> timedelta:
        """Time from ``occurrence`` to the one after it."""
        return self.next_after(occurrence) - occurrence

    def __repr__(self) -> str:
        return f"NcrontabSchedule({self.expression!r})"
