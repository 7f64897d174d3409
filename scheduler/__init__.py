"""Scheduler: order intake, claims, step dispatch, reply handling and compensation."""
