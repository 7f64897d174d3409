"""`orderctl`: run the Scheduler Agent Supervisor pattern on this machine.

orderctl up [--detach] start Azurite, the broker, the fake services and function hosts, and
                       keep them running (restarting any that dies)
orderctl down          stop a stack started with `up --detach` (or any `up`), by PID
orderctl ps            the stack's processes, addresses and restarts
orderctl submit        send an OrderSubmitted message to the orders queue (--wait: until done)
orderctl status ID     an order's state, steps and timeline (--watch: follow it live)
orderctl trace ID      an order's spans across every queue hop, with durations (`up --telemetry`)
orderctl orders STATE  orders in a state (Processed too), filtered, sorted, paged
orderctl alerts        operator alerts and whether each is resolved (--open); ack SEQ
orderctl resubmit, cancel, restart    operator actions on one order, or on a filter (bulk)
orderctl dead-letters  dead letters per queue; replay or purge them
orderctl dead-letter-log   the dead-letter replays and purges operators ran, and why
orderctl fault         the fake services' fault profile on the running stack; decline the next N
orderctl health        whether the app's settings, table and Service Bus work
orderctl demo          submit orders under a fault profile and watch the pattern cope
orderctl supervisor    the Supervisor's lag, bucket leases and recovery bound
orderctl purge         archive, then delete, finished orders past an age (or count: --dry-run)
orderctl purges        the recorded purge runs
orderctl archived ID   a purged order, read back from the archive
orderctl workflows     workflow versions, the orders on each, and whether this code may
                       be deployed over them (--check: exit 1 if not)
orderctl workflow-diff A B   what changed between two workflow versions
orderctl migrate       move orders in flight to another workflow version (dry run by default)

Remote mode: `orderctl --api-url URL` (or ORDERCTL_API_URL, or `--azd-env FILE` with `azd env
get-values` output) runs the operator commands over the operator HTTP API of a deployed app (or
of a local stack) instead of in process, with a function key (--function-key,
ORDERCTL_FUNCTION_KEY) and/or an Entra token (--entra, ORDERCTL_AUTH=entra; --scope,
ORDERCTL_SCOPE). Same output either way.

Every command takes --json (one document on stdout, shapes in docs/orderctl.md); tables take
--wide. Errors are one line on stderr with a non-zero exit code (2: fix the input or start the
stack; 1: something failed); --debug shows the traceback instead. `status --watch` and `submit
--wait` exit 0 when the order is Processed, 3 when it is in Error, 4 when the wait ran out.

This module is the entry point (the `orderctl` script, `python -m orderctl.cli`): it imports the
modules that declare the commands on :data:`orderctl.app.app`, one concern each, and runs it.
"""

from __future__ import annotations

from orderctl import (  # noqa: F401 - importing each declares its commands on the app
    alert_commands,
    dead_letter_commands,
    demo_command,
    fault_commands,
    health_commands,
    order_action_commands,
    order_commands,
    purge_commands,
    stack_commands,
    trace_commands,
    workflow_commands,
)
from orderctl.app import app


def main() -> None:
    app()


if __name__ == "__main__":
    main()
