"""The client tests' names for the shared server harness
(tools/tbharness/tbharness.py: a free loopback port, a start-up deadline,
stopped by pid), plus the LD_PRELOAD clock shim. Environment: REDIS_SERVER
(default ``redis-server`` on PATH) and TB_MODULE (default
``target/release/libtb.so`` at the repository root)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tools" / "tbharness"))

from tbharness import (  # noqa: E402,F401  (re-exported for the tests)
    REPO,
    START_DEADLINE,
    STOP_DEADLINE,
    Server,
    example_redis,
    free_cluster_port,
    free_port,
    module_path,
    redis_server_bin,
)


def clockshift_lib() -> str:
    """The LD_PRELOAD clock shim (tests/clockshift/clockshift.c at the
    repository root), built with the C compiler (``CC`` or ``cc``) into
    target/clockshift/ when missing or older than its source. A server started
    with ``env=clockshift_env(path)`` takes its wall clock from the control
    file ``path`` (the format is in the C file)."""
    src = REPO / "tests/clockshift/clockshift.c"
    out = REPO / "target/clockshift/libclockshift.so"
    if not out.is_file() or out.stat().st_mtime < src.stat().st_mtime:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f"{out.name}.{os.getpid()}")
        cc = os.environ.get("CC") or "cc"
        subprocess.run([cc, "-O2", "-shared", "-fPIC", "-Wall", "-Wextra", "-Werror", "-o", str(tmp), str(src), "-ldl"],
                       check=True)
        os.replace(tmp, out)
    return str(out)


def clockshift_env(control_file: str) -> dict[str, str]:
    """Environment for a server whose wall clock ``control_file`` controls."""
    return {"LD_PRELOAD": clockshift_lib(), "TB_CLOCK_FILE": control_file}
