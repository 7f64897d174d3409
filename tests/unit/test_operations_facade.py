"""Operations is a facade: each public method hands its arguments, as given, to the use case of
the same name in the module of its resource, so both must take the same parameters with the same
defaults (a default changed in one place only would change what one front end does)."""

from __future__ import annotations

import inspect

from service.operations import (
    alerts,
    bulk,
    dead_letter_log,
    dead_letters,
    health,
    orders,
    purge,
    supervisor,
)
from service.operations.operations import Operations

MODULES = (orders, bulk, supervisor, alerts, dead_letters, dead_letter_log, purge, health)
OWN = {"close", "use_archive"}


def shape(function: object) -> list[tuple[str, object, object]]:
    parameters = list(inspect.signature(function).parameters.values())[1:]  # self, ctx
    return [(p.name, p.kind, p.default) for p in parameters]


def test_every_method_takes_what_its_use_case_takes() -> None:
    methods = {
        name: member
        for name, member in vars(Operations).items()
        if inspect.iscoroutinefunction(member) and not name.startswith("_") and name not in OWN
    }
    assert len(methods) == 20
    for name, method in methods.items():
        owners = [
            m for m in MODULES if getattr(getattr(m, name, None), "__module__", "") == m.__name__
        ]
        assert len(owners) == 1, (name, owners)
        assert shape(method) == shape(getattr(owners[0], name)), name
