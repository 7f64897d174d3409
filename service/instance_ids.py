"""Who acts, as recorded in LockedBy and the timeline: the ids service.runtime gives each process
(and tests and tools give their runtimes)."""

from __future__ import annotations

import os
import socket
import uuid


def new_instance_id(role: str = "app") -> str:
    """Who acts, as recorded in LockedBy and the timeline: host, process and a random part."""
    host = "".join(c for c in socket.gethostname() if c.isalnum() or c in "-.")[:40] or "host"
    return f"{role}@{host}.{os.getpid()}.{uuid.uuid4().hex[:8]}"
