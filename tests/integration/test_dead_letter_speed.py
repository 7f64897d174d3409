"""How long the dead-letter listing takes against the local broker: GET /api/dead-letters peeks
every queue's dead letters (seven queues); it must answer in well under a second or two, and
repeated calls must not open a link per peek."""

from __future__ import annotations

import time

import pytest

from orderctl.local import LocalOperations
from service import runtime
from service.operations.context import current

pytestmark = [pytest.mark.anyio, pytest.mark.integration]


@pytest.fixture
async def installed(rt):
    previous = runtime.install(rt)
    yield rt
    await (await current()).close()
    runtime.install(previous)


async def test_dead_letter_summary_is_quick(installed):
    ops = LocalOperations(installed)
    try:
        started = time.perf_counter()
        first = await ops.dead_letter_summary()
        cold = time.perf_counter() - started
        timings = []
        for _ in range(3):
            started = time.perf_counter()
            again = await ops.dead_letter_summary()
            timings.append(time.perf_counter() - started)
        print(f"\ndead_letter_summary: cold {cold:.3f} s, warm {[round(t, 3) for t in timings]}")
        assert {q.queue for q in first.queues} == set(installed.settings.queues)
        assert again.queues == first.queues
        assert cold < 3.0, f"cold listing took {cold:.2f} s"
        assert max(timings) < 1.0, f"warm listings took {timings}"
    finally:
        await ops.close()
