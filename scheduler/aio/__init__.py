"""The Scheduler's async I/O shell (intake, replies); the sync twins are generated from it."""
