"""What a host's CPU is spent on: the code that deploys, or the development host's own machinery.

A function host here is two things in one process: the app (what deploys: the entry points,
``service/``, ``domain/``, ``adapters/`` and the libraries they call) and the local stand-in
for the Azure Functions host (``devstack/host``: it receives each message, converts it to a
``func.ServiceBusMessage``, opens the invocation's span, renews the lock, settles the message
and writes its stats file). In Azure the Functions host (.NET) does the second part on the
instance, outside the Python worker; Azurite and the development broker are not on the app's
cores at all. So the CPU per order that an instance spends in Azure is the first part only.

:class:`Sampler` samples the hosts with py-spy (``--threads``, so each sample names its OS
thread) while a batch runs, and reads each thread's CPU time from ``/proc`` before and after.
:func:`classify` puts each sample's stack in a part and a kind:

- ``deploys``: the stack passes through the user function the host invoked (the frame under
  ``Invoker.call_async`` or ``Invoker.call``), or holds a frame of the app's packages with no
  host frame above it (a task the app started, such as a Supervisor sweep's), or sits in the
  app's HTTP client (aiohttp: the host itself makes no HTTP request).
- ``dev_host``: a ``devstack/host`` frame and no user function under it (receive, settle, lock
  renewal, conversion, the invocation span, stats, the timer runner's schedule).
- ``shared``: the event loop's own work (only ``asyncio`` frames), the Service Bus SDK's
  connection reads (each in a task of its own under ``asyncio.wait_for``, which does not say
  whether a receiver of the host or a sender of the app waits for it), and stacks py-spy cut
  short. Shared CPU is divided between the two parts in proportion to what each was seen
  spending (:func:`Split.apportioned`): the loop runs callbacks for both.
- ``idle``: a thread waiting (in ``select``, a lock, a queue), or in a socket write (see
  :data:`SOCKET_WRITE_LEAVES`). Under load a thread just woken is runnable but not running, and
  py-spy counts runnable threads as active; such samples are dropped.

A thread's CPU (``/proc/<pid>/task/<tid>/stat``) is divided among the kinds its samples show,
in proportion to their counts, so that threads are weighed by what they really spent, not by
how often they were runnable; CPU of threads with no sample left (ended, or only idle samples)
is divided like the process's. The kinds within each part say where the time goes
(:data:`DEPLOY_KINDS`, :data:`HOST_KINDS`).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Literal

Part = Literal["deploys", "dev_host", "shared", "idle"]

APP_PACKAGES: Final = (
    "adapters",
    "agent",
    "dashboard",
    "domain",
    "operator_api",
    "retention",
    "scheduler",
    "service",
    "supervisor",
)
"""The repository's folders that deploy (with function_app.py)."""
HOST_DIR: Final = "devstack/host/"
INVOKER_CALLS: Final = frozenset({"Invoker.call_async", "Invoker.call"})

DEPLOY_KINDS: Final[tuple[tuple[str, tuple[str, ...]], ...]] = (
    # (kind, what a frame's "function file" text contains); the first kind any frame of the
    # stack matches wins, so cross-cutting costs are counted once, where they are paid.
    ("logging", ("/logging/",)),
    ("telemetry", ("opentelemetry/", "adapters/telemetry.py", "adapters/metrics.py")),
    ("signing", ("domain/signing.py", "/hmac.py")),
    ("snapshot", ("service/resume.py",)),
    ("validation and encoding", ("pydantic/", "pydantic_core/", "domain/messages.py")),
    ("state rows", ("adapters/store/rows.py",)),
    ("lifecycle", ("domain/lifecycle.py", "domain/order.py", "domain/workflows.py")),
    ("Table requests", ("adapters/tables/", "adapters/store/")),
    ("Service Bus sends", ("adapters/servicebus.py", "azure/servicebus/")),
    ("remote calls", ("adapters/remote_http.py", "service/remote_calls.py", "service/circuit.py")),
    ("HTTP (aiohttp, azure-core)", ("aiohttp/", "azure/core/", "multidict/", "yarl/")),
)
HOST_KINDS: Final[tuple[tuple[str, tuple[str, ...]], ...]] = (
    ("conversion", ("to_function_message", "trigger_value", "azure/functions/")),
    ("invocation span", ("Invoker._invocation", "opentelemetry/")),
    ("lock renewal", ("AutoLockRenewer", "renew_message_lock", "_auto_lock_renew")),
    ("settle", ("complete_message", "abandon_message", "_Slot._settle")),
    ("receive", ("receive_messages",)),
    ("stats", ("devstack/host/stats.py", "write_stats")),
    ("timer", ("devstack/host/timer_runner.py", "croniter/")),
)
HOST_ONLY: Final = ("AutoLockRenewer", "ServiceBusReceiver", "_servicebus_receiver")
"""The Service Bus SDK's receiving side: the app only sends, so this is the host's even in a
task or a stack py-spy cut short with no ``devstack/host`` frame."""
SOCKET_WRITE_LEAVES: Final = frozenset(
    {
        "_SelectorSocketTransport.write",
        "_SelectorSocketTransport._write_ready",
        "_SelectorSocketTransport.writelines",
        "socket.send",
        "socket.sendall",
    }
)
"""A leaf here is almost never CPU: a write costs 30 to 50 µs of CPU on this machine (timed per call
with ``time.process_time``), and it wakes the reader (the broker, Azurite, a fake), which on two
cores takes the CPU from the writer while it is still in the call; py-spy counts that runnable
thread as active, and showed 10 times more samples there than the writes' CPU (docs/performance.md,
"What the sampled socket writes were"). Such samples are dropped, as a thread just woken in
``select`` is: the thread's CPU is divided among its other samples."""
IDLE_LEAVES: Final = frozenset(
    {
        "EpollSelector.select",
        "PollSelector.select",
        "SelectSelector.select",
        "_PollLikeSelector.select",
        "Condition.wait",
        "Event.wait",
        "Thread.join",
        "Thread._wait_for_tstate_lock",
        "Queue.get",
        "SimpleQueue.get",
        "BaseServer.serve_forever",
    }
)


@dataclass(frozen=True)
class Frame:
    function: str
    file: str

    @classmethod
    def parse(cls, text: str) -> Frame:
        """``function (file:line)`` as py-spy writes it (``--full-filenames``)."""
        name, _, rest = text.partition(" (")
        return cls(name, rest.rsplit(":", 1)[0].rstrip(")"))

    def text(self) -> str:
        return f"{self.function} {self.file}"


def classify(stack: Sequence[Frame], root: str) -> tuple[Part, str]:
    """The part and kind of one sample, its frames outermost first; ``root``: the
    repository's directory, which the app's and the host's file names start with."""
    if not stack:
        return "shared", "cut short"
    if stack[-1].function in IDLE_LEAVES:
        return "idle", "waiting"
    if stack[-1].function in SOCKET_WRITE_LEAVES:
        return "idle", "runnable after a send"
    app = [_is_app(frame.file, root) for frame in stack]
    host = [frame.file.startswith(root + HOST_DIR) for frame in stack]
    entry = _user_function(stack, host, app)
    if entry is not None:
        return "deploys", _deploy_kind(stack[entry:])
    texts = [frame.text() for frame in stack]
    if any(host) or any(mark in text for text in texts for mark in HOST_ONLY):
        return "dev_host", _kind(stack, HOST_KINDS, "host other")
    if any(app):
        return "deploys", _deploy_kind(stack[app.index(True) :])
    if any("aiohttp/" in text for text in texts):
        return "deploys", _deploy_kind(stack)
    if any("/_pyamqp/" in text for text in texts):
        return "shared", "Service Bus connection reads"
    if all("asyncio/" in frame.file or "threading.py" in frame.file for frame in stack):
        return "shared", "event loop"
    return "shared", "cut short"


def _is_app(file: str, root: str) -> bool:
    if not file.startswith(root):
        return False
    inside = file[len(root) :]
    return inside == "function_app.py" or inside.split("/", 1)[0] in APP_PACKAGES


def _user_function(stack: Sequence[Frame], host: Sequence[bool], app: Sequence[bool]) -> int | None:
    """Where the user function the host invoked starts in ``stack``, if it is there: an app
    frame right under the invoker's call (anything else there is the invoker's own work)."""
    for index in range(len(stack) - 1, 0, -1):
        if stack[index - 1].function in INVOKER_CALLS and host[index - 1] and app[index]:
            return index
    return None


def _deploy_kind(stack: Sequence[Frame]) -> str:
    return _kind(stack, DEPLOY_KINDS, "app other")


def _kind(stack: Sequence[Frame], kinds: Sequence[tuple[str, tuple[str, ...]]], other: str) -> str:
    texts = [frame.text() for frame in stack]
    for kind, marks in kinds:
        if any(mark in text for text in texts for mark in marks):
            return kind
    return other


# ------------------------------------------------------------------------------ samples


@dataclass
class Samples:
    """One process's samples: per OS thread, per (part, kind), a count."""

    threads: dict[int, Counter[tuple[Part, str]]] = field(default_factory=dict)

    @classmethod
    def read(cls, lines: Iterable[str], root: str) -> Samples:
        """py-spy's raw output (``--threads --full-filenames``): ``thread (tid): name;frame;...
        count`` per line."""
        samples = cls()
        for line in lines:
            stack_text, _, count = line.rstrip("\n").rpartition(" ")
            if not stack_text or not count.isdigit():
                continue
            frames = stack_text.split(";")
            tid = 0
            if frames and frames[0].startswith("thread ("):
                tid = int(frames[0][len("thread (") :].split(")", 1)[0], 0)
                frames = frames[1:]
            stack = [Frame.parse(text) for text in frames if text]
            counter = samples.threads.setdefault(tid, Counter())
            counter[classify(stack, root)] += int(count)
        return samples


@dataclass
class Split:
    """CPU seconds per (part, kind)."""

    seconds: dict[tuple[str, str], float] = field(default_factory=dict)

    def add(self, part: str, kind: str, seconds: float) -> None:
        key = (part, kind)
        self.seconds[key] = self.seconds.get(key, 0.0) + seconds

    def part(self, part: str) -> float:
        return sum(s for (p, _), s in self.seconds.items() if p == part)

    def kinds(self, part: str) -> dict[str, float]:
        return {k: s for (p, k), s in sorted(self.seconds.items()) if p == part}

    def apportioned(self) -> tuple[float, float]:
        """(deploys, dev_host) with the shared CPU divided in proportion to them."""
        deploys, host, shared = self.part("deploys"), self.part("dev_host"), self.part("shared")
        seen = deploys + host
        if seen <= 0:
            return 0.0, shared
        return deploys + shared * deploys / seen, host + shared * host / seen


def attribute(samples: Samples, thread_cpu: Mapping[int, float], process_cpu: float) -> Split:
    """Divide ``process_cpu`` seconds by the samples: each thread's own CPU (``thread_cpu``)
    by its samples, the rest (threads without a sample that counts, threads that ended) by
    all the process's samples."""
    split = Split()
    whole: Counter[tuple[Part, str]] = Counter()
    for counts in samples.threads.values():
        whole.update({key: n for key, n in counts.items() if key[0] != "idle"})
    left = process_cpu
    for tid, cpu in thread_cpu.items():
        counts = Counter(
            {k: n for k, n in samples.threads.get(tid, Counter()).items() if k[0] != "idle"}
        )
        total = sum(counts.values())
        if total == 0 or cpu <= 0:
            continue
        for (part, kind), n in counts.items():
            split.add(part, kind, cpu * n / total)
        left -= cpu
    everything = sum(whole.values())
    if left > 0:
        if everything == 0:
            split.add("shared", "unsampled", left)
        else:
            for (part, kind), n in whole.items():
                split.add(part, kind, left * n / everything)
    return split


# ------------------------------------------------------------------------------ sampling


def cpu_seconds(stat_path: str) -> float:
    """User + system CPU seconds in a ``/proc/.../stat`` file (0 if it is gone)."""
    try:
        fields = Path(stat_path).read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def thread_cpu(pid: int) -> dict[int, float]:
    """CPU seconds of each thread of ``pid`` so far."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return {}
    return {int(tid): cpu_seconds(f"/proc/{pid}/task/{tid}/stat") for tid in tids}


def py_spy() -> str | None:
    """The py-spy executable beside this interpreter (requirements-dev.txt), or on PATH."""
    beside = Path(sys.executable).with_name("py-spy")
    return str(beside) if beside.exists() else shutil.which("py-spy")


class Sampler:
    """py-spy on each of ``pids`` from :meth:`start` to :meth:`stop`, and their threads' CPU.

    py-spy reads the processes' memory from outside (ptrace; as root, or with
    ``kernel.yama.ptrace_scope`` 0 for one's own processes) without stopping them
    (``--nonblocking``); its own CPU is :attr:`sampler_cpu_s`, on the same cores."""

    RATE_HZ: Final = 97
    """Samples a second per process: off the round numbers the hosts' own timers tick at."""

    def __init__(self, executable: str, pids: Mapping[str, int], workdir: Path) -> None:
        self.executable = executable
        self.pids = dict(pids)
        self.workdir = workdir
        self._spies: dict[str, subprocess.Popen[bytes]] = {}
        self._threads: dict[str, dict[int, float]] = {}
        self._process: dict[str, float] = {}
        self.sampler_cpu_s = 0.0

    def _path(self, name: str, suffix: str) -> Path:
        return self.workdir / f"py-spy-{name}.{suffix}"

    def start(self) -> None:
        for name, pid in self.pids.items():
            out = self._path(name, "txt")
            out.unlink(missing_ok=True)
            argv = [self.executable, "record", "--pid", str(pid), "--rate", str(self.RATE_HZ)]
            argv += ["--threads", "--full-filenames", "--nonblocking", "--format", "raw"]
            argv += ["--output", str(out)]
            with open(self._path(name, "log"), "wb") as log:
                self._spies[name] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        time.sleep(0.5)  # py-spy reads the process's symbols before its first sample
        for name, spy in self._spies.items():
            if spy.poll() is not None:
                raise RuntimeError(f"py-spy could not sample {name}: {self._log(name)}")
        self._threads = {name: thread_cpu(pid) for name, pid in self.pids.items()}
        self._process = {n: cpu_seconds(f"/proc/{pid}/stat") for n, pid in self.pids.items()}

    def stop(self, root: str) -> dict[str, Split]:
        """Stop sampling; each process's CPU since :meth:`start`, split."""
        threads = {name: thread_cpu(pid) for name, pid in self.pids.items()}
        process = {n: cpu_seconds(f"/proc/{pid}/stat") for n, pid in self.pids.items()}
        for spy in self._spies.values():
            self.sampler_cpu_s += cpu_seconds(f"/proc/{spy.pid}/stat")
            spy.send_signal(signal.SIGINT)
        for spy in self._spies.values():
            try:
                spy.wait(30)
            except subprocess.TimeoutExpired:
                spy.kill()
                spy.wait()
        splits = {}
        for name in self.pids:
            out = self._path(name, "txt")
            if not out.exists():
                raise RuntimeError(f"py-spy wrote no samples for {name}: {self._log(name)}")
            samples = Samples.read(out.read_text().splitlines(), root)
            before = self._threads.get(name, {})
            used = {tid: cpu - before.get(tid, 0.0) for tid, cpu in threads[name].items()}
            splits[name] = attribute(samples, used, process[name] - self._process.get(name, 0.0))
        self._spies.clear()
        return splits

    def _log(self, name: str) -> str:
        try:
            return self._path(name, "log").read_text()[-2000:]
        except OSError:
            return "(no log)"


def merged(splits: Iterable[Split]) -> Split:
    total = Split()
    for split in splits:
        for (part, kind), seconds in split.seconds.items():
            total.add(part, kind, seconds)
    return total


def per_workflow_ms(split: Split, count: int) -> dict[str, dict[str, float]]:
    """CPU milliseconds per workflow, per part and kind."""
    out: dict[str, dict[str, float]] = defaultdict(dict)
    for (part, kind), seconds in sorted(split.seconds.items()):
        out[part][kind] = round(seconds * 1000 / count, 3)
    return dict(out)
