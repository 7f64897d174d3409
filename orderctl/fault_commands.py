"""`orderctl fault`: the fault profile of the running stack's fake services, shown or
changed, and declining their next N calls."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from devstack.stack.local_stack import DEFAULT_WORKDIR
from orderctl import connection, views
from orderctl.app import app, emit, fail, output
from orderctl.options import Json, Workdir
from orderctl.output import FaultView
from orderctl.plain_text import join_url


@app.command()
def fault(
    profile: Annotated[
        str | None,
        typer.Argument(
            help="clean, flaky, chaotic, stress or a profile file; omit to show what is in force"
        ),
    ] = None,
    decline_next: Annotated[
        int | None,
        typer.Option(
            "--decline-next",
            min=0,
            max=100_000,
            help="decline the next N forward calls of --service (0: stop declining)",
        ),
    ] = None,
    service: Annotated[
        str, typer.Option(help="with --decline-next: inventory, payment or shipping")
    ] = "payment",
    json_out: Json = False,
    workdir: Workdir = DEFAULT_WORKDIR,
) -> None:
    """Show or choose the fault profile of the running stack's fake services, or make the next
    N payments (or reservations, shipments) be declined. It stays until changed again, a fake
    services process restarted by the stack included; a new stack starts from `up --profile`."""
    import httpx

    from devstack.fakes.profiles import SERVICE_NAMES, source_name
    from devstack.stack.local_stack import profile_path

    screen = output(json_out)
    info = connection.running_stack(workdir)
    change: dict[str, Any] = {}
    if profile is not None:
        connection.check_profile(profile)
        path = profile_path(profile)
        change |= {"profile": json.loads(path.read_text()), "source": source_name(path)}
    if decline_next is not None:
        if service not in SERVICE_NAMES:
            raise fail(f"--service {service!r}: one of {', '.join(SERVICE_NAMES)}", 2)
        change["decline_next"] = {"service": service, "count": decline_next}
    url = join_url(info.fakes_url, "_fault")
    try:
        answer = httpx.post(url, json=change, timeout=10) if change else httpx.get(url, timeout=10)
    except httpx.HTTPError as error:
        raise fail(
            f"cannot reach the fake services at {url} ({type(error).__name__}): see `orderctl ps`",
            1,
        ) from None
    if answer.status_code != 200:
        raise fail(f"the fake services refused it: {answer.text[:300]}", 2)
    view = FaultView(fakes_url=info.fakes_url, changed=bool(change), **answer.json())
    emit(view, views.show_fault, screen)
