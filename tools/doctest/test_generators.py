"""The generators in tools/ (they write files that are then only checked
for staleness, so their own logic is tested here): the security page's
figures are read from the runs' summary lines, and a changed limit points at
the prose that still states its old value.
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import catalogue  # noqa: E402
import security_figures  # noqa: E402

FUZZ_LONG = """\
fuzz: 10 targets, 60 s each: 1234567 inputs tried, crashes found: 0

== protocol and RESTORE fuzzers, large counts, on Redis server v=7.0.15
hostile: 1200 commands (5 in MULTI, 6 in scripts) on 8 connections in 60 batches, 7 error replies, \
8 clients dropped mid-command; 9 bucket states checked; crashes found: 0
test restore_fuzz_large ... restore_fuzz: 2000 payloads tried (1 loaded, 2 refused), crashes found: 0

== protocol and RESTORE fuzzers, large counts, on Valkey server v=9.1.2
hostile: 1300 commands (5 in MULTI, 6 in scripts) on 8 connections in 60 batches, 7 error replies, \
8 clients dropped mid-command; 9 bucket states checked; crashes found: 0
restore_fuzz: 2100 payloads tried (1 loaded, 2 refused), crashes found: 0
"""

SOAK = """\
== soak, 300 s of load, on Redis server v=8.2.3
soak ((8, 2, 3)): 300 s of load, 340 s in all; 100000 buckets at once, 555 churn buckets, 1953 audited \
requests, 206 grants (999 tokens) within the exact bound over 1547 windows, 3 clients vanished mid-BLOCK, \
2 BGSAVE, 1 BGREWRITEAOF; digests equal over 0 keys; memory 21 -> peak 73 -> 22 bytes (replica 11 -> 12) \
after 22563 buckets, memory still after 1.0s and 0.9s of waiting
"""


def test_fuzz_long_figures_per_server() -> None:
    got = security_figures.parse(FUZZ_LONG.splitlines())
    assert got["fuzz"] == {"targets": 10, "seconds": 60, "inputs": 1234567, "crashes": 0}
    assert got["hostile"] == [{"server": "Redis 7.0", "count": 1200}, {"server": "Valkey 9.1", "count": 1300}]
    assert got["restore"] == [{"server": "Redis 7.0", "count": 2000}, {"server": "Valkey 9.1", "count": 2100}]


def test_soak_figures() -> None:
    (row,) = security_figures.parse(SOAK.splitlines())["soak"]
    assert row == {"server": "Redis 8.2", "seconds": 300, "requests": 1953, "grants": 206, "windows": 1547,
                   "memory": [21, 73, 22], "replica": [11, 12], "buckets": 22563}


def test_a_server_without_its_summary_line_fails_the_record() -> None:
    lines = [line for line in FUZZ_LONG.splitlines() if not line.startswith("restore_fuzz: 2100")]
    with pytest.raises(SystemExit, match="2 server"):
        security_figures.parse(lines)


def test_the_page_is_what_the_figures_give() -> None:
    figures = json.loads(security_figures.FIGURES.read_text(encoding="utf-8"))
    page = security_figures.PAGE.read_text(encoding="utf-8")
    assert security_figures.render(page, figures) == page
    other = copy.deepcopy(figures)
    other["fuzz"]["inputs"] += 1
    assert security_figures.render(page, other) != page


def test_a_changed_limit_points_at_the_prose_that_states_it() -> None:
    cat = json.loads(catalogue.CATALOGUE.read_text(encoding="utf-8"))
    changed = copy.deepcopy(cat)
    changed["limits"]["MAX_LEASES"] = cat["limits"]["MAX_LEASES"] * 2
    mentions = catalogue.old_value_mentions(cat, changed)
    assert any(m.startswith("  docs/design/leases.md:") and "MAX_LEASES" in m for m in mentions), mentions
    assert not any(m.startswith("  BENCHMARKS.md:") for m in mentions), "measured figures are not prose to edit"
    assert catalogue.old_value_mentions(cat, cat) == []
