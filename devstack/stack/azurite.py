"""Azurite (the Azure Storage emulator from npm): start, describe, stop.

Azurite is started with port 0 for all three services; it prints the ports it chose
("Azurite Blob service is successfully listening at http://127.0.0.1:PORT"), which are read
from its log, so no port is guessed and nothing races for one.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from devstack.stack import processes

ACCOUNT_NAME = "devstoreaccount1"
# Azurite's published, well-known development key (not a secret).
ACCOUNT_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)
AZURITE_BIN = processes.REPO_ROOT / "node_modules" / ".bin" / "azurite"

STARTUP_TIMEOUT_S = 30.0
_LISTENING = re.compile(
    r"Azurite (Blob|Queue|Table) service is successfully listening at (http://\S+?):(\d+)"
)


@dataclass(frozen=True)
class StorageAccount:
    """Where the tests' storage is. ``pid`` is None when it is an external account."""

    connection_string: str
    blob_endpoint: str
    queue_endpoint: str
    table_endpoint: str
    pid: int | None = None
    log_path: Path | None = field(default=None, compare=False)


def connection_string_for(blob: str, queue: str, table: str) -> str:
    return (
        "DefaultEndpointsProtocol=http;"
        f"AccountName={ACCOUNT_NAME};AccountKey={ACCOUNT_KEY};"
        f"BlobEndpoint={blob};QueueEndpoint={queue};TableEndpoint={table};"
    )


def from_connection_string(conn: str) -> StorageAccount:
    """Describe an existing account (Azurite elsewhere, or a real storage account)."""
    parts: dict[str, str] = {}
    for item in conn.split(";"):
        if "=" in item:
            key, value = item.split("=", 1)
            parts[key.strip().lower()] = value.strip()
    if parts.get("usedevelopmentstorage", "").lower() == "true":
        host = "http://127.0.0.1"
        return StorageAccount(
            connection_string=conn,
            blob_endpoint=f"{host}:10000/{ACCOUNT_NAME}",
            queue_endpoint=f"{host}:10001/{ACCOUNT_NAME}",
            table_endpoint=f"{host}:10002/{ACCOUNT_NAME}",
        )
    protocol = parts.get("defaultendpointsprotocol", "https")
    account = parts.get("accountname", "")
    suffix = parts.get("endpointsuffix", "core.windows.net")

    def endpoint(service: str) -> str:
        explicit = parts.get(f"{service}endpoint")
        if explicit:
            return explicit.rstrip("/")
        if not account:
            raise ValueError(
                f"the connection string has neither {service.capitalize()}Endpoint nor AccountName"
            )
        return f"{protocol}://{account}.{service}.{suffix}"

    return StorageAccount(
        connection_string=conn,
        blob_endpoint=endpoint("blob"),
        queue_endpoint=endpoint("queue"),
        table_endpoint=endpoint("table"),
    )


class AzuriteProcess:
    """One Azurite with blob, queue and table services on ports it picks itself.

    It runs in ``workdir``, in memory unless ``location`` names a directory to keep its data
    in (``--location`` cannot be combined with ``--inMemoryPersistence``). On disk, Azurite's
    table store is saved every 5 s (LokiJS autosave) and on a clean stop, so a killed Azurite
    loses at most the table writes of its last 5 s; blobs are written through.
    """

    def __init__(
        self, workdir: Path, host: str = "127.0.0.1", *, location: Path | None = None
    ) -> None:
        self.workdir = Path(workdir)
        self.host = host
        self.location = Path(location) if location is not None else None
        self.log_path = self.workdir / "azurite.log"
        self._proc: subprocess.Popen | None = None
        self.account: StorageAccount | None = None
        self._ports: tuple[int, int, int] | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    @property
    def exit_code(self) -> int | None:
        """The exit code if the process has ended on its own, else None."""
        return self._proc.poll() if self._proc is not None else None

    @property
    def ports(self) -> tuple[int, int, int] | None:
        """Blob, queue and table ports, once started."""
        return self._ports

    def restart(self) -> StorageAccount:
        """Stop (if running) and start again on the same ports: clients keep their settings."""
        ports = self._ports
        self.stop()
        return self.start(ports=ports)

    def start(self, ports: tuple[int, int, int] | None = None) -> StorageAccount:
        if self._proc is not None:
            raise RuntimeError("Azurite is already started")
        if not AZURITE_BIN.exists():
            raise processes.ServiceStartError(
                f"Azurite is not installed ({AZURITE_BIN} is missing): "
                "run scripts/bootstrap (it runs `npm ci`)."
            )
        self.workdir.mkdir(parents=True, exist_ok=True)
        h = self.host
        blob, queue, table = (str(p) for p in ports or (0, 0, 0))
        if self.location is not None:
            self.location.mkdir(parents=True, exist_ok=True)
            storage = ["--location", str(self.location)]
        else:
            storage = ["--inMemoryPersistence"]
        argv = [
            str(AZURITE_BIN),
            "--silent",
            *storage,
            "--disableTelemetry",
            "--skipApiVersionCheck",
            "--loose",
            "--blobHost", h, "--queueHost", h, "--tableHost", h,
            "--blobPort", blob, "--queuePort", queue, "--tablePort", table,
        ]  # fmt: skip
        self._proc = processes.spawn(argv, log_path=self.log_path, cwd=self.workdir)
        endpoints: dict[str, str] = {}

        def all_listening() -> bool:
            text = self.log_path.read_text(errors="replace")
            for service, base, port in _LISTENING.findall(text):
                endpoints[service.lower()] = f"{base}:{port}/{ACCOUNT_NAME}"
            return len(endpoints) == 3

        ok = processes.wait_until(all_listening, timeout=STARTUP_TIMEOUT_S, proc=self._proc)
        ok = ok and all(
            processes.wait_until(
                lambda url=url: processes.http_answers(url), timeout=10.0, proc=self._proc
            )
            for url in endpoints.values()
        )
        if not ok:
            code = self._proc.poll()
            self.stop()
            state = f"exited with code {code}" if code is not None else "did not come up"
            raise processes.ServiceStartError(
                f"Azurite {state} within {STARTUP_TIMEOUT_S:.0f} s. "
                f"Last lines of {self.log_path}:\n{processes.tail(self.log_path)}"
            )
        self._ports = (
            _port_of(endpoints["blob"]),
            _port_of(endpoints["queue"]),
            _port_of(endpoints["table"]),
        )
        self.account = StorageAccount(
            connection_string=connection_string_for(
                endpoints["blob"], endpoints["queue"], endpoints["table"]
            ),
            blob_endpoint=endpoints["blob"],
            queue_endpoint=endpoints["queue"],
            table_endpoint=endpoints["table"],
            pid=self._proc.pid,
            log_path=self.log_path,
        )
        return self.account

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 5 s; safe to call twice."""
        if self._proc is not None:
            processes.stop(self._proc)
            self._proc = None

    def __enter__(self) -> StorageAccount:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _port_of(endpoint: str) -> int:
    """The port of ``http://127.0.0.1:PORT/devstoreaccount1``."""
    return int(endpoint.rsplit(":", 1)[1].split("/", 1)[0])
