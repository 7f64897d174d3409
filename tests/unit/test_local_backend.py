"""`orderctl`'s local backend is the operator use cases themselves, each with its context bound:
every operation the protocol declares must be a use case of that name that accepts what the
protocol says, by name and kind, with the same defaults where the protocol gives one (a default
changed in one place only would change what `orderctl` does in one mode)."""

from __future__ import annotations

import inspect

from orderctl.backend import OperatorBackend
from orderctl.local import USE_CASES, LocalOperations


def test_every_use_case_is_bound_once_by_its_own_name() -> None:
    names = [use_case.__name__ for use_case in USE_CASES]
    assert len(names) == len(set(names)) == 20
    assert not set(names) & set(vars(LocalOperations)), "a method would hide a use case"
    for use_case in USE_CASES:
        first = next(iter(inspect.signature(use_case).parameters))
        assert first == "ctx", use_case.__qualname__


def test_every_protocol_operation_is_a_use_case_taking_what_it_declares() -> None:
    use_cases = {use_case.__name__: use_case for use_case in USE_CASES}
    declared = {
        name: member
        for name, member in vars(OperatorBackend).items()
        if inspect.iscoroutinefunction(member) and name != "close"
    }
    assert len(declared) == 19
    for name, member in declared.items():
        offered = inspect.signature(use_cases[name]).parameters
        for parameter in list(inspect.signature(member).parameters.values())[1:]:  # self
            assert parameter.name in offered, (name, parameter.name)
            assert offered[parameter.name].kind == parameter.kind, (name, parameter.name)
            if parameter.default is not inspect.Parameter.empty:
                assert offered[parameter.name].default == parameter.default, (name, parameter.name)
