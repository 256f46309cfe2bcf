"""The generators in tools/ (they write files that are then only checked
for staleness, so their own logic is tested here): a changed limit points
at the prose that still states its old value.
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import catalogue  # noqa: E402


def test_a_changed_limit_points_at_the_prose_that_states_it() -> None:
    cat = json.loads(catalogue.CATALOGUE.read_text(encoding="utf-8"))
    changed = copy.deepcopy(cat)
    changed["limits"]["MAX_LEASES"] = cat["limits"]["MAX_LEASES"] * 2
    mentions = catalogue.old_value_mentions(cat, changed)
    assert any(m.startswith("  docs/design/leases.md:") and "MAX_LEASES" in m for m in mentions), mentions
    assert not any(m.startswith("  BENCHMARKS.md:") for m in mentions), "measured figures are not prose to edit"
    assert catalogue.old_value_mentions(cat, cat) == []
