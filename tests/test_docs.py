"""The README's figures agree with the documents that record where they came from."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]


def _demo_table() -> dict[str, float]:
    """method → test accuracy (%) from the demo table in docs/results/demo.md."""
    section = (ROOT / "docs" / "results" / "demo.md").read_text().split("\n## ")[0]
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
    assert set(quoted) == set(table), "README and docs/results/demo.md list different methods"
    assert quoted == table, "README's expected demo figures differ from docs/results/demo.md"


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


def test_config_reference__every_description_whole_and_every_alias_spelled_out():
    """No doc is cut (each row of docs/config.md ends a sentence), no type is an alias name,
    and the plain list's first sentences survive abbreviations."""
    from dcco.config.reference import first_sentence

    settings = (ROOT / "docs" / "config.md").read_text().split("## Defaults for your own")[0]
    rows = [line for line in settings.splitlines()
            if line.startswith("| `") and "." in line.split("|")[1]]
    assert len(rows) > 100
    for row in rows:
        what = row.rsplit("|", 2)[1].strip()
        assert what.endswith((".", ".)", '."')) and "…" not in what, row
        kind = row.split("|")[2]
        for alias in ("DatasetName", "Arch", "Precision", "Norm", "Compile", "Literal"):
            assert alias not in kind, row
    assert first_sentence("VICReg's coefficients (Bardes et al. 2022: 25). More.") == \
        "VICReg's coefficients (Bardes et al. 2022: 25)."
    assert first_sentence("A table (e.g. parquet) of rows, e.g. CSV. None: none.") == \
        "A table (e.g. parquet) of rows, e.g. CSV."
    assert first_sentence("One sentence only") == "One sentence only"


def test_config_reference__says_where_fit_and_the_strategy_set_other_defaults():
    """docs/config.md's last section lists every key whose default differs under
    ``dcco.fit`` (the config ``fit`` really builds, compared with a config file's), and the
    Flower strategy's arguments with their defaults (``dcco.config.USER``)."""
    import inspect

    from dcco.config import USER
    from dcco.fitting import fit_defaults
    from dcco.flower import DCCOStrategy

    text = (ROOT / "docs" / "config.md").read_text()
    section = text[text.index("## Defaults for your own model"):]
    keys = [row.split("|")[1].strip().strip("`") for row in section.splitlines()
            if row.startswith("| `")]
    assert keys == [k for k, _, _ in fit_defaults()]
    assert {"loss.lambd", "optim.lr", "optim.warmup_rounds", "model.projector"} <= set(keys)
    assert "| `loss.lambd` | `20.0` | `5.0` |" in section
    strategy = inspect.signature(DCCOStrategy).parameters
    for name, value in (("optimizer", USER.optim.optimizer), ("lr", USER.optim.lr),
                        ("warmup_rounds", USER.optim.warmup_rounds), ("lambd", USER.lambd)):
        assert strategy[name].default == value
        assert f"`{name}={value!r}`" in section, name


def test_config_command__plain_prints_the_list_as_list_does(capsys):
    from dcco.cli import main

    assert main(["config"]) == 0
    plain = capsys.readouterr().out
    assert main(["config", "--list"]) == 0
    assert capsys.readouterr().out == plain and "optim.lr" in plain


def test_methods_table__the_guides_is_the_readmes_and_names_every_method():
    """The methods' table (paper, what a client sends, exchanges, state, backends) is the
    same in the README and docs/guide.md, and has a row for every method dcco registers."""
    from dcco.methods.registry import METHODS

    def table(path: Path) -> list[str]:
        lines = path.read_text().splitlines()
        start = next(i for i, line in enumerate(lines) if line.startswith("| method | from |"))
        end = next(i for i in range(start, len(lines) + 1)
                   if i == len(lines) or not lines[i].startswith("|"))
        return lines[start:end]

    readme = table(ROOT / "README.md")
    assert readme == table(ROOT / "docs" / "guide.md")
    named = {name for row in readme[2:] for name in re.findall(r"`(\w+)`", row.split("|")[1])}
    centralized = {"centralized_byol", "centralized_simsiam"}  # "(and centralized)"
    assert set(METHODS) - centralized <= named, set(METHODS) - centralized - named


def test_readme__stops_early_and_its_links_resolve():
    """The README is a short tour (at most 180 lines), every file it links exists, and its
    one outside link is the paper's."""
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 180
    targets = re.findall(r"\]\(([^)#]+)", readme)
    assert [t for t in targets if t.startswith("https://")] == [
        "https://arxiv.org/abs/2210.00092"]
    for target in targets:
        assert target.startswith("https://") or (ROOT / target).exists(), target
    assert (ROOT / "LICENSE").read_text().lstrip().startswith("Apache License")


def _anchors(text: str) -> set[str]:
    """The anchors GitHub gives a Markdown file's headings (outside code blocks)."""
    found, fence = set(), False
    for line in text.splitlines():
        if line.startswith("```"):
            fence = not fence
        m = re.match(r"#{1,6} (.*)", line)
        if m and not fence:
            found.add(re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-"))
    return found


def test_docs__every_link_between_the_docs_resolves_to_a_file_and_heading():
    """Every relative link of the README and of docs/ (the results' studies included) names a
    file that exists and, where it names a heading, a heading that file has; the results index
    links every study, and no file still points at the single results page it replaced."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    broken = []
    for page in pages:
        fence = False
        for n, line in enumerate(page.read_text().splitlines(), 1):
            if line.startswith("```"):
                fence = not fence
            for target in ([] if fence else re.findall(r"\]\(([^)\s]+)\)", line)):
                if re.match(r"[a-z]+:", target):
                    continue
                path, _, anchor = target.partition("#")
                dest = (page.parent / path).resolve() if path else page
                if not dest.exists():
                    broken.append(f"{page.relative_to(ROOT)}:{n}: {target} (no such file)")
                elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest.read_text()):
                    broken.append(f"{page.relative_to(ROOT)}:{n}: {target} (no such heading)")
    assert not broken, "\n".join(broken)
    results = ROOT / "docs" / "results"
    index = (results / "README.md").read_text()
    studies = sorted(p.name for p in results.glob("*.md") if p.name != "README.md")
    assert len(studies) >= 20 and all(f"]({name})" in index for name in studies)
    assert not (ROOT / "docs" / "results.md").exists()
    stale = [str(p.relative_to(ROOT)) for p in [*pages, *(ROOT / "src").rglob("*.py")]
             if "docs/results.md" in p.read_text() and p.name != "CHANGELOG.md"]
    assert not stale, stale


RUN_ELSEWHERE = {  # blocks that a test runs as written: (file, the block's first line)
    ("docs/guide.md", "import torch"): "test_guide__linear_evaluation_example_runs",
    ("docs/own_code.md", "import torch"): "test_docs__the_round_in_your_own_loop_runs_as_written",
    ("docs/multimodal.md", "import torch"): "test_multimodal_guide__example_runs_and_beats_chance",
}


def _python_blocks() -> list[tuple[str, int, str]]:
    """(file, line, code) of every ```python block in the README and docs/."""
    import re

    out = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        text = path.read_text()
        for m in re.finditer(r"^```python\n(.*?)^```", text, re.MULTILINE | re.DOTALL):
            out.append((str(path.relative_to(ROOT)), text[:m.start()].count("\n") + 1,
                        m.group(1)))
    return out


def _bound_calls(code: str, names: dict) -> int:
    """Every call in ``code`` to a name it can resolve (its own imports, then ``names``) is
    bound to the callee's real signature, its positional arguments counted and its keywords
    named; a call that does not bind raises TypeError. Returns how many were bound."""
    import ast
    import importlib
    import inspect

    tree = ast.parse(code)
    scope = dict(names)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            module = importlib.import_module(node.module)
            scope.update({a.asname or a.name: getattr(module, a.name) for a in node.names})
        elif isinstance(node, ast.Import):
            scope.update({a.asname or a.name: importlib.import_module(a.name)
                          for a in node.names})

    def resolve(expr):
        if isinstance(expr, ast.Name):
            return scope.get(expr.id)
        if isinstance(expr, ast.Attribute):
            owner = resolve(expr.value)
            return getattr(owner, expr.attr) if owner is not None else None
        return None

    bound = 0
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        target = resolve(node.func)
        if target is None or any(isinstance(a, ast.Starred) for a in node.args) or any(
                k.arg is None for k in node.keywords):
            continue
        try:
            signature = inspect.signature(target)
        except ValueError:  # a builtin without one (torch.cat): not the docs' API
            continue
        signature.bind(*range(len(node.args)), **{k.arg: None for k in node.keywords})
        bound += 1
    return bound


def test_docs__every_python_block_runs_or_binds_to_the_real_api():
    """Every ```python block in the README and docs/ is run by a test as written
    (``RUN_ELSEWHERE``), or is a fragment that compiles and whose every call to a dcco,
    Flower or torch name binds to that callable's real signature (no argument that the API
    does not take), with at least one such call."""
    from flwr.app import ArrayRecord

    import dcco
    import dcco.flower

    names = {"dcco": dcco, "DCCO": dcco.flower.DCCOStrategy, "answer": dcco.flower.answer,
             "evaluate_encoder": dcco.flower.evaluate_encoder,
             "ImageViews": dcco.ImageViews, "SecAgg": dcco.flower.SecAgg,
             "ArrayRecord": ArrayRecord}
    blocks = _python_blocks()
    assert len(blocks) >= 10
    here = (ROOT / "tests").glob("test_*.py")
    tests = "".join(p.read_text() for p in here)
    for path, line, code in blocks:
        where = f"{path}:{line}"
        compile(code, where, "exec")
        runner = RUN_ELSEWHERE.get((path, code.splitlines()[0]))
        if runner is not None:
            assert f"def {runner}(" in tests, where
            continue
        assert _bound_calls(code, names) >= 1, f"{where}: no call to a known name"


def test_docs__the_block_checker_catches_a_wrong_keyword_and_a_missing_argument():
    import dcco

    assert _bound_calls("dcco.fit(enc, clients, rounds=3)", {"dcco": dcco}) == 1
    with pytest.raises(TypeError):
        _bound_calls("dcco.fit(enc, clients, round=3)", {"dcco": dcco})
    with pytest.raises(TypeError):
        _bound_calls("dcco.linear_probe(enc)", {"dcco": dcco})


GONE_FROM_THE_CHANGELOG = {
    # removed, each in the entry that says so ("Removed", "is gone")
    "dcco.config_reference", "dcco.core.privacy.PrivacyConfig", "dcco.data.TableConfig",
    "dcco.evaluate.EvalConfig", "dcco.evaluate.settings.EvalConfig",
    "dcco.flower.strategy.DCCO", "dcco.flower.strategy_checkpoint", "dcco.image_views",
    "dcco.methods.LossConfig", "dcco.models.ModelConfig", "dcco.models.config", "dcco.scalars",
    "dcco.config.USER_RECIPE", "dcco.run.setup.CHECKED",
    # keys of a Flower run config (DCCOStrategy.from_run_config), not Python paths
    "dcco.aggregation", "dcco.lr", "dcco.loss", "dcco.warmup",
}
"""The ``dcco.*`` paths the CHANGELOG names that do not import, on purpose."""


def _resolves(path: str) -> bool:
    import importlib
    import warnings

    parts = path.split(".")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for i in range(len(parts), 0, -1):
            try:
                obj = importlib.import_module(".".join(parts[:i]))
            except ImportError:
                continue
            try:
                for name in parts[i:]:
                    obj = getattr(obj, name)
            except AttributeError:
                return False
            return True
    return False


def test_changelog__names_only_paths_that_import_or_that_it_says_are_gone():
    """Every `dcco.…` path in CHANGELOG.md imports (a module or a name in one), or is in
    ``GONE_FROM_THE_CHANGELOG`` (removed, or a run-config key); a path it tells a reader to
    use that does not exist (``dcco.config.model`` once) fails here."""
    text = (ROOT / "CHANGELOG.md").read_text()
    named = set(re.findall(r"`(dcco(?:\.[A-Za-z_][A-Za-z0-9_]*)+)", text))
    missing = sorted(p for p in named if p not in GONE_FROM_THE_CHANGELOG and not _resolves(p))
    assert not missing, f"CHANGELOG.md names paths that do not import: {missing}"
    assert _resolves("dcco.config.model_config") and not _resolves("dcco.config.model")


def _public_entries() -> list[tuple[str, object]]:
    import inspect

    import dcco
    import dcco.flower

    out = []
    for module in (dcco, dcco.flower):
        for name in module.__all__:
            obj = getattr(module, name)
            if inspect.isfunction(obj) or (inspect.isclass(obj) and not issubclass(
                    obj, BaseException)):
                out.append((f"{module.__name__}.{name}", obj))
    return out


@pytest.mark.parametrize("name,obj", _public_entries(), ids=[n for n, _ in _public_entries()])
def test_public_entry__documents_every_parameter_in_numpy_style(name, obj):
    """Every public function and class of ``dcco`` and ``dcco.flower`` lists each parameter of
    its signature on one line with its type (and default), numpy style, as Flower's
    strategies do: ``name : type (default: value)`` under "Parameters" (a result that dcco
    builds, ``FitResult`` say, under "Attributes")."""
    import inspect
    import re

    doc = inspect.getdoc(obj) or ""
    params = [p for p in inspect.signature(obj).parameters.values() if p.name != "self"]
    assert "Args:" not in doc and "Raises:" not in doc, f"{name}: Google-style sections left"
    if not params:
        return
    assert "\nParameters\n----------\n" in doc or "\nAttributes\n----------\n" in doc, \
        f"{name} has no numpy 'Parameters' (or 'Attributes') section"
    entries = {n.strip().lstrip("*") for line in doc.splitlines()
               if (m := re.match(r"^([\w*]+(?:, [\w*]+)*) : \S", line))
               for n in m.group(1).split(",")}
    missing = [p.name for p in params if p.name not in entries]
    assert not missing, f"{name}'s docstring lists no 'name : type' line for {missing}"
    for p in params:
        if p.default is not inspect.Parameter.empty and p.kind is not p.VAR_KEYWORD:
            line = next(x for x in doc.splitlines() if re.match(
                rf"^(?:[\w*]+, )*{p.name}(?:, [\w*]+)* : ", x))
            assert "default" in line, f"{name}: {p.name}'s line does not give its default"
