"""The README's figures agree with the documents that record where they came from."""

from __future__ import annotations

import os
import re
import subprocess
import sys
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


def test_guide__linear_evaluation_example_runs(tiny_config, tiny_fmnist, tmp_path):
    """docs/guide.md's example of a trained encoder in the user's own code, on tiny data."""
    from dcco.cli import main

    run = tmp_path / "run"
    assert main(["pretrain", str(tiny_config(rounds=2)), "--run-dir", str(run),
                 "--no-progress"]) == 0
    guide = (ROOT / "docs" / "guide.md").read_text()
    section = guide.split("## A trained encoder in your own code")[1]
    code = section.split("```python\n")[1].split("```")[0]
    assert 'dcco.load_encoder("runs/' in code
    code = re.sub(r'dcco\.load_encoder\("[^"]+"\)', f'dcco.load_encoder("{run}")', code)
    code = code.replace('load_dataset("fashion_mnist", "train")',
                        f'load_dataset("fashion_mnist", "train", "{tiny_fmnist}")')
    code = code.replace('load_dataset("fashion_mnist", "test")',
                        f'load_dataset("fashion_mnist", "test", "{tiny_fmnist}")')
    script = tmp_path / "my_linear_eval.py"  # the user's own script, run as they would
    script.write_text(code)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=300, check=False,
                          env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    assert done.returncode == 0, done.stderr
    assert re.fullmatch(r"linear probe: \d+\.\d%\n", done.stdout)


def test_config_reference__docs_config_md_is_the_code_s(capsys):
    """docs/config.md is what `dcco config --list --markdown` prints now: every key of every
    section, its type, default and doc (regenerate it with that command)."""
    from dataclasses import fields

    from dcco.cli import main
    from dcco.config.reference import sections

    assert main(["config", "--list", "--markdown"]) == 0
    printed = capsys.readouterr().out
    assert (ROOT / "docs" / "config.md").read_text() == printed, \
        "docs/config.md is stale: dcco config --list --markdown > docs/config.md"
    for name, cls, _ in sections():
        for f in fields(cls):
            row = next(line for line in printed.splitlines()
                       if line.startswith(f"| `{name}.{f.name}` |"))
            assert row.split("|")[4].strip(), f"{name}.{f.name} has no doc in the code"


def test_config_command__plain_prints_the_list_as_list_does(capsys):
    from dcco.cli import main

    assert main(["config"]) == 0
    plain = capsys.readouterr().out
    assert main(["config", "--list"]) == 0
    assert capsys.readouterr().out == plain and "optim.lr" in plain


def test_readme__stops_early_and_its_links_resolve():
    """The README is a short tour (at most 250 lines), and every file it links exists."""
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    for target in re.findall(r"\]\(([^)#]+)", readme):
        assert (ROOT / target).exists(), target
