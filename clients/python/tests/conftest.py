"""Fixtures: one redis-server with the tb module and one without (where the
client falls back to the Lua script), both started by the tests themselves.
Every test that takes ``limiter`` runs against both backends."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Iterator

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from tbserver import Server  # noqa: E402

from tb_limiter import Limiter  # noqa: E402


@pytest.fixture(scope="session")
def module_server() -> Iterator[Server]:
    s = Server(with_module=True)
    yield s
    s.stop()


@pytest.fixture(scope="session")
def plain_server() -> Iterator[Server]:
    s = Server(with_module=False)
    yield s
    s.stop()


@pytest.fixture(params=["module", "lua"])
def server(request: pytest.FixtureRequest) -> Server:
    """The server of one backend: with the module, or without it (Lua)."""
    s: Server = request.getfixturevalue("module_server" if request.param == "module" else "plain_server")
    s.client().flushall()
    return s


@pytest.fixture
def limiter(server: Server) -> Iterator[Limiter]:
    """A Limiter on ``auto`` over a client made for the test: the first call
    must pick the module, or the script."""
    client = server.client()
    lim = Limiter(client)
    assert lim.backend is None, "decided by the first call, not by a probe"
    lim.bucket("probe", 1, 1).peek()
    assert lim.backend == ("module" if server.with_module else "lua")
    client.flushall()
    yield lim
    client.close()
