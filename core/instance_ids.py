"""Who acts, as recorded in LockedBy and the timeline: one definition for core.runtime and its
async source core.runtime."""

from __future__ import annotations

import os
import socket
import uuid


def new_instance_id(role: str = "app") -> str:
    """Who acts, as recorded in LockedBy and the timeline: host, process and a random part."""
    host = "".join(c for c in socket.gethostname() if c.isalnum() or c in "-.")[:40] or "host"
    return f"{role}@{host}.{os.getpid()}.{uuid.uuid4().hex[:8]}"
