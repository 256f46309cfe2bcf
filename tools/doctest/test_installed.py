"""The client the python blocks run against is the installed package
(``make test-docs`` installs the built wheel, then the sdist, into fresh
venvs), not the source tree, and holds every file of the source package:
a file the packaging leaves out (``tb.lua``, ``py.typed``, the dashboard's
static files) fails here, and in the blocks that need it."""

from __future__ import annotations

import subprocess
from importlib import metadata, resources
from pathlib import Path

import tb_limiter

from runners import ROOT

SRC = ROOT / "clients" / "python" / "src" / "tb_limiter"


def test_the_client_is_installed_not_the_source_tree() -> None:
    here = Path(tb_limiter.__file__).resolve()
    assert not here.is_relative_to(SRC), f"tb_limiter imported from the source tree: {here}"
    direct = metadata.distribution("tb-limiter").read_text("direct_url.json") or ""
    assert '"dir_info"' not in direct, f"installed from the source directory, not a built wheel or sdist: {direct}"


def test_every_file_of_the_package_is_installed() -> None:
    listed = subprocess.run(
        ["git", "ls-files", "."], cwd=SRC, check=True, capture_output=True, text=True
    ).stdout.split()
    assert "tb.lua" in listed and "py.typed" in listed
    installed = resources.files("tb_limiter")
    missing = [name for name in listed if not installed.joinpath(name).is_file()]
    assert not missing, f"the installed package lacks {missing}"
    assert installed.joinpath("tb.lua").read_bytes() == (ROOT / "lua" / "tb.lua").read_bytes()
