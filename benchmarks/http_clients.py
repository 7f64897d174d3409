"""Client CPU per HTTP operation, the app's HTTP clients side by side with what they replace:
the Table client (adapters.tables: the app's wire format on azure-core's pipeline over aiohttp)
against azure-data-tables' asyncio client, and the agents' POST through adapters.remote_http
(one aiohttp session, traced and bounded; and bare, without either) against httpx.AsyncClient
as configured by default.

    python -m benchmarks.http_clients [--rounds 5] [--operations 1000]

Table operations go to a fresh Azurite (a point read, an ETag-conditional update, a transaction
of two upserts, a query page of ten rows); POSTs to a server in another process that answers
at once. CPU is this process's (``time.process_time``) over ``--operations`` operations, in
milliseconds per operation; each round measures every client once, in turn, so they share the
machine's load; the JSON printed holds each round and the medians.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import httpx
from azure.core import MatchConditions
from azure.data.tables.aio import TableServiceClient

from adapters.remote_http import RemoteHttp, RemoteService
from adapters.tables import TableService
from devstack.stack.azurite import AzuriteProcess

Operation = Callable[[], Awaitable[Any]]
BODY = json.dumps({"order_id": "order-1", "sku": "sku-1", "quantity": 1}).encode()
HEADERS = {
    "Idempotency-Key": "order-1:reserve:do:1",
    "Content-Type": "application/json",
    "Accept": "application/json",
}
ANSWER = b'{"status":"ok","reservation":"r-1"}'


async def cpu_ms(operation: Operation, count: int) -> float:
    for _ in range(min(100, count)):  # connections open, caches warm
        await operation()
    started = time.process_time()
    for _ in range(count):
        await operation()
    return (time.process_time() - started) / count * 1000


# ------------------------------------------------------------------------------- Tables


async def table_operations(service: Any, name: str) -> dict[str, Operation]:
    await service.create_table_if_not_exists(name)
    table = service.get_table_client(name)
    for i in range(10):
        await table.upsert_entity({"PartitionKey": "q", "RowKey": f"{i:03}", "S": "x" * 200})
    etag = (await table.upsert_entity({"PartitionKey": "p", "RowKey": "r", "N": 0}))["etag"]
    serial = 0

    async def read() -> None:
        await table.get_entity("p", "r")

    async def update() -> None:
        nonlocal etag
        row = {"PartitionKey": "p", "RowKey": "r", "N": 1}
        written = await table.update_entity(
            row, etag=etag, match_condition=MatchConditions.IfNotModified
        )
        etag = written["etag"]

    async def transaction() -> None:
        nonlocal serial
        serial += 1
        await table.submit_transaction(
            [
                ("upsert", {"PartitionKey": "b", "RowKey": "process", "N": serial}),
                ("upsert", {"PartitionKey": "b", "RowKey": f"t{serial % 50}", "S": "y" * 300}),
            ]
        )

    async def page() -> None:
        query = table.query_entities("PartitionKey eq @pk", parameters={"pk": "q"})
        await query.by_page().__anext__()

    return {"point read": read, "conditional update": update, "transaction of 2": transaction,
            "query page of 10": page}  # fmt: skip


async def tables_round(connection_string: str, count: int, round_no: int) -> dict[str, Any]:
    measured: dict[str, Any] = {}
    for label, cls, short in (
        ("azure-core pipeline (adapters.tables)", TableService, "app"),
        ("azure-data-tables", TableServiceClient, "sdk"),
    ):
        service = cls.from_connection_string(connection_string)
        name = f"bench{round_no}{short}"
        operations = await table_operations(service, name)
        measured[label] = {op: round(await cpu_ms(run, count), 3) for op, run in operations.items()}
        await service.delete_table(name)
        await service.close()
    return measured


# --------------------------------------------------------------------------- agents' POST


def serve_answers(port_file: str) -> None:
    """The POST server (run in its own process): answers every request at once."""

    class Answering(asyncio.Protocol):
        def connection_made(self, transport: Any) -> None:
            self.transport, self.buffer = transport, b""

        def data_received(self, data: bytes) -> None:
            self.buffer += data
            while (end := self.buffer.find(b"\r\n\r\n")) >= 0:
                length = 0
                for line in self.buffer[:end].split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                if len(self.buffer) < end + 4 + length:
                    return
                self.buffer = self.buffer[end + 4 + length :]
                self.transport.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                    + str(len(ANSWER)).encode() + b"\r\n\r\n" + ANSWER
                )  # fmt: skip

    async def main() -> None:
        server = await asyncio.get_running_loop().create_server(Answering, "127.0.0.1", 0)
        Path(port_file).write_text(str(server.sockets[0].getsockname()[1]))
        await server.serve_forever()

    asyncio.run(main())


async def posts_round(origin: str, count: int) -> dict[str, float]:
    url = f"{origin}/inventory/reserve"
    measured: dict[str, float] = {}
    remote = RemoteHttp([RemoteService("inventory", f"{origin}/inventory")])

    async def through_adapter() -> None:
        await remote.post("inventory", "reserve", BODY, HEADERS, timeout=10)

    measured["aiohttp session (adapters.remote_http)"] = await cpu_ms(through_adapter, count)
    await remote.close()
    async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as session:

        async def bare() -> None:  # what the adapter adds: the span, the deadline, the bounds
            async with session.post(url, data=BODY, headers=HEADERS) as answer:
                await answer.read()

        measured["aiohttp session, bare"] = await cpu_ms(bare, count)
    async with httpx.AsyncClient() as client:

        async def through_httpx() -> None:
            async with client.stream(
                "POST", url, content=BODY, headers=HEADERS, timeout=httpx.Timeout(10)
            ) as answer:
                await answer.aread()

        measured["httpx.AsyncClient, default"] = await cpu_ms(through_httpx, count)
    return {label: round(ms, 3) for label, ms in measured.items()}


# ---------------------------------------------------------------------------------- run


def medians(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    first = rounds[0]
    if not isinstance(first, dict) or not all(isinstance(v, dict) for v in first.values()):
        return {key: round(statistics.median(r[key] for r in rounds), 3) for key in first}
    return {key: medians([r[key] for r in rounds]) for key in first}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--operations", type=int, default=1000)
    parser.add_argument("--serve", metavar="PORT_FILE", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve_answers(args.serve)
        return
    with tempfile.TemporaryDirectory() as scratch:
        port_file = Path(scratch) / "port"
        server = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.http_clients", "--serve", str(port_file)]
        )
        azurite = AzuriteProcess(Path(scratch) / "azurite")
        try:
            account = azurite.start()
            while not port_file.exists() or not port_file.read_text():
                time.sleep(0.05)
            origin = f"http://127.0.0.1:{port_file.read_text()}"
            report = asyncio.run(measure(account.connection_string, origin, args))
        finally:
            azurite.stop()
            server.terminate()
            server.wait()
    print(json.dumps(report, indent=2))


async def measure(connection_string: str, origin: str, args: argparse.Namespace) -> dict:
    load_before = os.getloadavg()
    table_rounds, post_rounds = [], []
    for round_no in range(args.rounds):
        table_rounds.append(await tables_round(connection_string, args.operations, round_no))
        post_rounds.append(await posts_round(origin, args.operations))
    return {
        "unit": "client CPU ms per operation (median of rounds)",
        "operations_per_round": args.operations,
        "load_average_before_after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
        "tables": medians(table_rounds),
        "agents_post": medians(post_rounds),
        "rounds": {"tables": table_rounds, "agents_post": post_rounds},
    }


if __name__ == "__main__":
    main()
