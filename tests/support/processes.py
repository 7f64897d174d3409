"""Moved to devstack.stack.processes (the CLI uses it too); kept while imports migrate."""

from devstack.stack.processes import *  # noqa: F403
from devstack.stack.processes import REPO_ROOT, ServiceStartError  # noqa: F401
