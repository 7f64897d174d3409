"""What the commands work on: the local stack on this machine (about to be started, or
running), or in remote mode the operator HTTP API of a deployed app (or of a local stack)."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, cast

from devstack.stack.local_stack import TELEMETRY_SUBDIR, StackInfo
from devstack.stack.processes import REPO_ROOT
from orderctl.app import MODE, fail
from orderctl.remote_config import API_URL_ENV, RemoteError, resolve
from service.operations.errors import OperatorError

if TYPE_CHECKING:
    from orderctl.backend import OperatorBackend


def check_installed() -> None:
    if not (REPO_ROOT / "node_modules" / ".bin" / "azurite").exists():
        raise fail("Azurite is not installed: run scripts/bootstrap (it runs `npm ci`)", 2)


def check_profile(profile: str) -> None:
    """Refuse a bad fault profile before anything starts, naming the line or field at fault."""
    from devstack.fakes.profiles import ProfileError, load_profile
    from devstack.stack.local_stack import profile_path

    try:
        load_profile(profile_path(profile))
    except (ProfileError, ValueError, OSError) as error:
        raise fail(f"fault profile: {' '.join(str(error).split())}", 2) from None


def running_stack(workdir: Path) -> StackInfo:
    if MODE.remote is not None:
        raise fail(
            f"`orderctl {MODE.command}` works on the local stack only (the operator HTTP API does "
            f"not serve it): run it without --api-url/--azd-env, and {API_URL_ENV} unset",
            2,
        )
    info = StackInfo.load(workdir)
    if info is None:
        raise fail(
            f"no running stack in {workdir}: start one with `orderctl up --detach` "
            "(or run `orderctl demo`, which starts its own)",
            2,
        )
    return info


def telemetry_path(workdir: Path, on: bool, directory: Path | None) -> Path | None:
    """Where a stack started now writes its telemetry: None when off."""
    if directory is not None:
        return directory.resolve()
    return (workdir / TELEMETRY_SUBDIR).resolve() if on else None


@asynccontextmanager
async def operations(workdir: Path) -> AsyncIterator[OperatorBackend]:
    """The operator operations: in process on the running local stack, or in remote mode over
    the operator HTTP API. A refusal or a failure of either is one line and an exit code."""
    async with backend(workdir) as ops:
        try:
            yield ops
        except OperatorError as error:
            raise fail(f"{error.message} ({error.code})", 2) from None
        except RemoteError as error:
            raise fail(error.message, error.exit_code) from None


@asynccontextmanager
async def backend(workdir: Path) -> AsyncIterator[OperatorBackend]:
    """:class:`orderctl.local.LocalOperations` on the stack running from ``workdir``, or
    in remote mode :class:`orderctl.remote.RemoteOperations` on the API the options name."""
    if MODE.remote is not None:
        from orderctl.remote import RemoteOperations

        try:
            config = resolve(MODE.remote, read_text)
        except RemoteError as error:
            raise fail(error.message, error.exit_code) from None
        remote = RemoteOperations(config)
        try:
            yield remote
        finally:
            await remote.close()
        return
    from adapters.retention_settings import RetentionSettings
    from adapters.store.records import OrderRecords
    from orderctl.local import LocalOperations
    from service.runtime import Runtime

    info = running_stack(workdir)
    runtime = Runtime.from_settings(RetentionSettings.from_env(info.settings), OrderRecords)
    ops = LocalOperations(runtime)
    try:
        yield cast("OperatorBackend", ops)  # its use cases, set per instance, are the protocol's
    finally:
        await ops.close()
        await runtime.close()


def read_text(source: str) -> str:
    """A file's text, or stdin's with ``-`` (the azd env values)."""
    if source == "-":
        return sys.stdin.read()
    try:
        return Path(source).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        reason = error.strerror if isinstance(error, OSError) else "not UTF-8 text"
        raise RemoteError(f"cannot read --azd-env {source}: {reason}") from None
