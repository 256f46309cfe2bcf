"""Server time per call of the module and of the Lua fallback (INFO
commandstats usec_per_call), for a byte-rate bucket and ATMOST requests.

    clients/python/.venv/bin/python clients/python/bench.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools" / "tbharness"))

from tbharness import Server  # noqa: E402

from tb_limiter import Limiter  # noqa: E402

CALLS = 5000


def main() -> None:
    for with_module in (True, False):
        server = Server(with_module=with_module)
        try:
            lim = Limiter(server.client())
            bucket = lim.bucket("bytes", "1e7", 10**7)
            server.client().config_resetstat()
            for _ in range(CALLS):
                bucket.consume(65536, atmost=True)
            stats = server.client().info("commandstats")
            name = "cmdstat_tb.consume" if with_module else "cmdstat_evalsha"
            print(f"{lim.backend:6}  {stats[name]['usec_per_call']:7.2f} us per TB.CONSUME ({CALLS} calls)")
        finally:
            server.stop()


if __name__ == "__main__":
    main()
