"""Retention: the timer that purges finished orders past the retention period."""
