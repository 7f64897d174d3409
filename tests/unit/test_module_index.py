"""The module index of docs/architecture.md names every deployed module, once, with the app that
loads it, and nothing else.

What deploys is computed, never listed here: each app's entry point is imported in a process of
its own with the app's settings (tests/support/module_map.py), and every module of the packages
they load from must have its row. A module an unmerged branch adds may be indexed ahead of it
("arrives with `branch`"), as long as it does not exist yet."""

from __future__ import annotations

from collections import Counter

from tests.support import module_map


def test_every_deployed_module_has_one_row_that_says_which_app_loads_it() -> None:
    deployed = module_map.deployed_modules()
    entries = module_map.index_entries()
    indexed = {entry.module: entry for entry in entries}
    where = f"docs/architecture.md, {module_map.INDEX_HEADING!r}"

    problems = [
        f"{module} ({label}) is deployed but not in {where}: add its row"
        for module, label in sorted(deployed.items())
        if module not in indexed
    ]
    problems += [
        f"{module} has {count} rows: keep one"
        for module, count in Counter(entry.module for entry in entries).items()
        if count > 1
    ]
    for entry in entries:
        if entry.arrives_with:
            if module_map.module_file(entry.module) is not None:
                problems.append(
                    f"line {entry.line}: {entry.module} exists now ({entry.arrives_with} is "
                    "merged): drop 'arrives with' from its row"
                )
        elif entry.module not in deployed:
            problems.append(
                f"line {entry.line}: {entry.module} is indexed but "
                + (
                    "is in no package either app loads from"
                    if module_map.module_file(entry.module)
                    else "no such module exists: remove its row"
                )
            )
        elif entry.label != deployed[entry.module]:
            problems.append(
                f"line {entry.line}: {entry.module} is marked {entry.label!r}, but "
                f"{deployed[entry.module]!r} is what loads it"
            )
        if entry.label not in module_map.LABELS:
            problems.append(
                f"line {entry.line}: {entry.module}: {entry.label!r} is not one of "
                f"{module_map.LABELS}"
            )
    assert not problems, "\n".join(problems)


def test_the_apps_are_seen_apart() -> None:
    """The computation tells the apps apart: the pattern app's own modules and the operations
    app's are both found, each in its app only."""
    deployed = module_map.deployed_modules()
    assert deployed["scheduler.functions"] == "pattern"
    assert deployed["operator_api.routes"] == "operations"
    assert deployed["domain.order"] == "both"
