"""The async sources of the app's I/O shell; their sync twins are generated (devstack.unasync)."""
