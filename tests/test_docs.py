"""The README's figures agree with the documents that record where they came from."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).parents[1]


def _demo_table() -> dict[str, float]:
    """method → test accuracy (%) from the demo table in docs/results.md."""
    text = (ROOT / "docs" / "results.md").read_text()
    section = text.split("## The main job: `dcco demo`")[1].split("\n## ")[0]
    rows = [line.split("|")[1:-1] for line in section.splitlines() if line.startswith("| ")]
    header, *body = rows
    assert header[-1].strip().startswith("test accuracy")
    return {cells[0].strip(): float(cells[-1]) for cells in body}


def test_readme__expected_demo_figures_match_docs_results():
    readme = (ROOT / "README.md").read_text()
    paragraph = readme.split("Expected figures")[1].split("\n\n")[0]
    quoted = {name: float(value) for name, value in re.findall(r"([a-z_]+)\s+(\d+\.\d)\s%",
                                                               paragraph)}
    table = _demo_table()
    assert set(quoted) == set(table), "README and docs/results.md list different methods"
    assert quoted == table, "README's expected demo figures differ from docs/results.md"
