"""Retention: the operations app's timer that purges finished orders past the retention period."""
