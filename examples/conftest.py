"""Shared fixtures of the examples' tests: redis-server processes started by
the tests (tools/tbharness: free port, deadline, stopped by pid)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Iterator

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tools" / "tbharness"))
sys.path.insert(0, str(HERE))

from tbharness import Server  # noqa: E402


@pytest.fixture(scope="session")
def module_server() -> Iterator[Server]:
    """A redis-server with the tb module."""
    s = Server(with_module=True)
    yield s
    s.stop()
