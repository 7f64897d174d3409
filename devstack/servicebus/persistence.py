"""SQLite write-through persistence for `--data-dir`: messages, schedules, dead letters, the
duplicate-detection history and sequence numbers survive a broker restart.

Every change is committed before the broker acknowledges the operation that caused it. WAL mode
with synchronous=NORMAL survives a killed broker process (not a power cut), which is the
failure a development broker must tolerate.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from devstack.servicebus.queues import StoredMessage

_SCHEMA = """
CREATE TABLE IF NOT EXISTS messages (
    queue TEXT NOT NULL,
    seq INTEGER NOT NULL,
    state TEXT NOT NULL,
    message_id TEXT,
    enqueued_at REAL NOT NULL,
    expires_at REAL NOT NULL,
    scheduled_at REAL,
    delivery_count INTEGER NOT NULL,
    durable INTEGER NOT NULL,
    priority INTEGER NOT NULL,
    dead_letter_source TEXT,
    annotations BLOB,
    body BLOB NOT NULL,
    PRIMARY KEY (queue, seq)
);
CREATE TABLE IF NOT EXISTS seen_ids (
    queue TEXT NOT NULL,
    message_id TEXT NOT NULL,
    seen_at REAL NOT NULL,
    PRIMARY KEY (queue, message_id)
);
CREATE TABLE IF NOT EXISTS sequences (
    queue TEXT PRIMARY KEY,
    next_seq INTEGER NOT NULL
);
"""

_COLUMNS = (
    "seq, state, message_id, enqueued_at, expires_at, scheduled_at, delivery_count, durable, "
    "priority, dead_letter_source, annotations, body"
)


class SqlitePersistence:
    def __init__(self, data_dir: Path) -> None:
        data_dir.mkdir(parents=True, exist_ok=True)
        self.path = data_dir / "servicebus.sqlite3"
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)
        self._depth = 0

    @contextmanager
    def atomic(self) -> Iterator[None]:
        """Group the writes of one client operation (a batch send) into one commit."""
        self._depth += 1
        if self._depth == 1:
            self._db.execute("BEGIN")
        try:
            yield
        except BaseException:
            if self._depth == 1:
                self._db.execute("ROLLBACK")
            raise
        else:
            if self._depth == 1:
                self._db.execute("COMMIT")
        finally:
            self._depth -= 1

    def save(self, queue: str, message: StoredMessage, next_seq: int) -> None:
        m = message
        self._db.execute(
            f"INSERT OR REPLACE INTO messages (queue, {_COLUMNS}) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                queue.lower(),
                m.seq,
                m.state,
                m.message_id,
                m.enqueued_at,
                m.expires_at if m.expires_at != float("inf") else 1e300,
                m.scheduled_at,
                m.delivery_count,
                int(m.durable),
                m.priority,
                m.dead_letter_source,
                m.annotations,
                m.body,
            ),
        )
        self._db.execute(
            "INSERT INTO sequences (queue, next_seq) VALUES (?, ?) "
            "ON CONFLICT(queue) DO UPDATE SET next_seq = excluded.next_seq",
            (queue.lower(), next_seq),
        )

    def delete(self, queue: str, seq: int) -> None:
        self._db.execute("DELETE FROM messages WHERE queue = ? AND seq = ?", (queue.lower(), seq))

    def update(self, queue: str, message: StoredMessage) -> None:
        self._db.execute(
            "UPDATE messages SET state = ?, delivery_count = ? WHERE queue = ? AND seq = ?",
            (message.state, message.delivery_count, queue.lower(), message.seq),
        )

    def remember_id(self, queue: str, message_id: str, at: float) -> None:
        self._db.execute(
            "INSERT OR REPLACE INTO seen_ids (queue, message_id, seen_at) VALUES (?, ?, ?)",
            (queue.lower(), message_id, at),
        )

    def forget_ids_before(self, queue: str, cutoff: float) -> None:
        self._db.execute(
            "DELETE FROM seen_ids WHERE queue = ? AND seen_at < ?", (queue.lower(), cutoff)
        )

    def load_messages(self, queue: str) -> list[StoredMessage]:
        rows = self._db.execute(
            f"SELECT {_COLUMNS} FROM messages WHERE queue = ? ORDER BY seq", (queue.lower(),)
        )
        return [
            StoredMessage(
                seq=seq,
                state=state,
                message_id=message_id,
                enqueued_at=enqueued_at,
                expires_at=expires_at if expires_at < 1e300 else float("inf"),
                scheduled_at=scheduled_at,
                delivery_count=delivery_count,
                durable=bool(durable),
                priority=priority,
                dead_letter_source=dead_letter_source,
                annotations=annotations,
                body=body,
            )
            for (
                seq,
                state,
                message_id,
                enqueued_at,
                expires_at,
                scheduled_at,
                delivery_count,
                durable,
                priority,
                dead_letter_source,
                annotations,
                body,
            ) in rows
        ]

    def load_next_seq(self, queue: str) -> int:
        row = self._db.execute(
            "SELECT next_seq FROM sequences WHERE queue = ?", (queue.lower(),)
        ).fetchone()
        return row[0] if row else 1

    def load_seen_ids(self, queue: str) -> list[tuple[str, float]]:
        return list(
            self._db.execute(
                "SELECT message_id, seen_at FROM seen_ids WHERE queue = ? ORDER BY seen_at",
                (queue.lower(),),
            )
        )

    def close(self) -> None:
        self._db.close()
