"""Runs the Rust example (examples/rust_client.rs, built by `make test-python`
with `cargo build --release --example rust_client`) against a redis-server
with the module and checks what it prints."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from tbharness import REPO, Server

BINARY = REPO / "target" / "release" / "examples" / "rust_client"


def test_rust_example(module_server: Server) -> None:
    assert BINARY.is_file(), f"{BINARY} missing: run `cargo build --release --example rust_client`"
    out = subprocess.run([str(BINARY), module_server.url], capture_output=True, text=True, timeout=30, check=True).stdout
    lines = out.splitlines()
    assert lines[0] == "consume 1: allowed=true remaining=2 retry_after_ms=0 reset_after_ms=500 granted=1"
    assert lines[2].startswith("consume 3: allowed=true remaining=0 ")
    assert re.match(r"consume 4: allowed=false remaining=0 retry_after_ms=(\d+) ", lines[3])
    reserved = re.match(r"reserved: allowed=true remaining=0 retry_after_ms=(\d+) .* granted=1$", lines[4])
    assert reserved and 0 < int(reserved.group(1)) <= 500
    assert re.match(r"refunded 2, remaining: Some\(2\)", lines[5])
    assert re.match(r"info: tokens=2(\.\d+)? capacity=3 rate=2 ", lines[6])
