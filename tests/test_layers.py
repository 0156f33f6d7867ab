"""The package's shape (docs/architecture.md): dependencies flow one way, from the core up to
the command line, never back; the top level stays short; no module outgrows one job."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "dcco"

LAYERS = (
    ("errors", "files", "config", "moved"),
    ("core", "core.seeding", "core.devices"),
    ("core.stats", "core.losses", "core.collapse"),
    ("methods", "models", "data", "evaluate", "core.client", "core.server", "core.optim",
     "core.privacy", "core.precision", "core.statistics_cache", "core.client_state"),
    ("core.algorithm", "core.simulator", "core.distributed"),
    ("run", "evaluate.runs", "reproduce", "flower", "api", "fitting"),
    ("cli", "demo", "__main__", "__init__"),
)
"""The layers, lowest first: a module may import its own layer and those below, never one
above (the longest matching name decides a module's layer: ``evaluate.runs`` evaluates run
directories and sits with the run, above the rest of ``evaluate``)."""


def _layer(module: str) -> int:
    best = (-1, -1)
    for rank, names in enumerate(LAYERS):
        for name in names:
            if (module == name or module.startswith(name + ".")) and len(name) > best[1]:
                best = (rank, len(name))
    assert best[0] >= 0, f"dcco.{module} is in no layer: add it to LAYERS"
    return best[0]


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        name = ".".join(path.relative_to(PACKAGE).with_suffix("").parts)
        out[name.removesuffix(".__init__") if name != "__init__" else "__init__"] = path
    return out


def _imports(path: Path, modules: set[str]) -> list[tuple[int, str]]:
    """(line, module) of every dcco import of the file at ``path`` (``_imports_of``)."""
    name = ".".join(path.relative_to(PACKAGE).with_suffix("").parts)
    return _imports_of(path.read_text(), name, modules)


def _imports_of(source: str, name: str, modules: set[str]) -> list[tuple[int, str]]:
    """(line, module) of every dcco import in ``source``, the text of module ``name``
    (dotted, below ``dcco``; a package's ``__init__`` as ``pkg.__init__``): absolute and
    relative ``import``/``from ... import``, and ``importlib.import_module`` of a constant
    name; function-level ones included, those under ``if TYPE_CHECKING:`` (names for
    annotations) left out. ``from dcco.core import stats`` is an import of ``core.stats``."""
    tree = ast.parse(source)
    skipped = {id(n) for node in ast.walk(tree)
               if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING"
               for n in ast.walk(node)}
    package = name.split(".")[:-1]  # a module's package (an __init__'s is its own)
    found = []

    def named(line: int, base: str, names: list[str]) -> None:
        for a in names:
            sub = f"{base}.{a}" if base else a
            if sub in modules:
                found.append((line, sub))
            elif base:
                found.append((line, base))

    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.ImportFrom) and node.level > 0:
            up = package[:len(package) - (node.level - 1)] if node.level - 1 <= len(
                package) else []
            base = ".".join([*up, *([node.module] if node.module else [])])
            named(node.lineno, base, [a.name for a in node.names])
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "dcco" or node.module.startswith("dcco."):
                named(node.lineno, node.module.removeprefix("dcco").removeprefix("."),
                      [a.name for a in node.names])
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name.removeprefix("dcco."))
                      for a in node.names if a.name.startswith("dcco.")]
        elif (isinstance(node, ast.Call) and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
              and (getattr(node.func, "attr", None) == "import_module"
                   or getattr(node.func, "id", None) == "import_module")
              and node.args[0].value.startswith("dcco.")):
            found.append((node.lineno, node.args[0].value.removeprefix("dcco.")))
    return found


def _upward(module: str, imports: list[tuple[int, str]]) -> list[str]:
    own = _layer(module)
    return [f"dcco.{module} (line {line}) imports dcco.{target}"
            for line, target in imports if _layer(target) > own]


def test_layers__the_detector_catches_every_form_of_an_upward_import():
    """A planted upward import in each form the test claims to catch is found and fails:
    absolute, ``from dcco import``, relative (one and two levels), and importlib's."""
    modules = set(_modules())
    planted = {
        "import dcco.run.loop": "run.loop",
        "from dcco.run import loop": "run.loop",
        "from dcco import cli": "cli",
        "from ..run.loop import run_pretraining": "run.loop",
        "from .. import api": "api",
        "def later():\n    from ..cli import main": "cli",
        "import importlib\nimportlib.import_module('dcco.flower.strategy')": "flower.strategy",
        "from importlib import import_module\nimport_module('dcco.run.loop')": "run.loop",
    }
    for source, target in planted.items():
        found = _imports_of(source, "core.stats", modules)
        assert [t for _, t in found] == [target], (source, found)
        assert _upward("core.stats", found), source
    # and the ones that are allowed stay allowed: the same layer, or below
    for source in ("from .losses import cco_loss", "from . import stats",
                   "import importlib\nimportlib.import_module('dcco.core.stats')"):
        assert not _upward("core.collapse", _imports_of(source, "core.collapse", modules)), \
            source
    hidden = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..run import loop"
    assert _imports_of(hidden, "core.stats", modules) == []


def test_layers__no_module_imports_a_layer_above_its_own():
    upward, modules = [], _modules()
    for module, path in modules.items():
        upward += _upward(module, _imports(path, set(modules)))
    assert not upward, "imports against the layers:\n" + "\n".join(sorted(upward))


def test_layers__the_config_is_a_leaf():
    """``dcco.config`` is plain data: it imports nothing of dcco but ``dcco.errors`` (the
    checks that need a method or a model are ``dcco.run.setup``'s), and loading it loads no
    torch, so reading and checking a config is quick anywhere (a Flower server's run config,
    ``dcco config``)."""
    modules = _modules()
    reached = {t for m, path in modules.items() if m.startswith("config")
               for _, t in _imports(path, set(modules))}
    assert {t for t in reached if not t.startswith("config")} <= {"errors"}, reached
    probe = ("import sys, dcco.config; "
             "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('dcco')))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True).stdout
    loaded = ast.literal_eval(out.strip())
    assert "torch" not in loaded, loaded
    assert all(m in ("dcco", "dcco.errors", "dcco.moved") or m.startswith("dcco.config")
               for m in loaded), loaded



def test_layers__the_checks_the_config_leaves_to_the_run_still_run(tmp_path):
    """A config built in code that only a method can refuse (FedSC's cached statistics for a
    method that shares none) is a valid ``RunConfig``; a run refuses it before anything is
    written: ``Pretraining``, ``RunDir.create`` and ``validate`` itself, naming the key."""
    import pytest

    from dcco.config import ConfigError, RunConfig, TrainConfig
    from dcco.run.pretraining import Pretraining
    from dcco.run.rundir import RunDir
    from dcco.run.setup import validate

    cfg = RunConfig(train=TrainConfig(method="contrastive_fedavg", absent_statistics="cached",
                                      device="cpu"))
    match = "train.absent_statistics = 'cached' keeps clients' shared statistics"
    for refuse in (validate, lambda c: Pretraining(c, None),
                   lambda c: RunDir.create(tmp_path / "run", c)):
        with pytest.raises(ConfigError, match=match):
            refuse(cfg)
    assert not (tmp_path / "run").exists()
    assert validate(RunConfig(train=TrainConfig(method="fedsc", absent_statistics="cached")))

def test_layers__the_test_sees_an_upward_import():
    """The check above is not vacuous: a core module importing the loop is caught."""
    assert _layer("core.stats") < _layer("run.loop")
    assert _layer("evaluate.knn") < _layer("evaluate.runs") == _layer("run.rundir")
    assert _layer("cli.grid") == _layer("cli") > _layer("fitting")


def test_layers__a_short_top_level_and_no_module_over_600_lines():
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= 12, top
    long = {str(p.relative_to(PACKAGE)): n for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 600}
    assert not long, long


def test_layers__the_flower_apps_import_no_testing_tool():
    """``dcco.flower.testing`` (the in-process grid, the loopback deployment, Flower's
    floor) is for tests and benchmarks: nothing else in the package imports it."""
    modules = _modules()
    users = [f"dcco.{m}" for m, path in modules.items()
             if not m.startswith("flower.testing")
             and any(t.startswith("flower.testing") for _, t in _imports(path, set(modules)))]
    assert not users, users


def test_layers__flower_is_split_by_role():
    """``dcco.flower.app`` (dcco's own app: what ``flwr run`` starts for this project) sits
    on the pieces it shares with a user's own Flower app (``strategy``, ``userapp`` and the
    codec, exchanges and SecAgg+ they use): nothing else in the package imports it, so a
    user's app never loads dcco's."""
    modules = _modules()

    def app(name: str) -> bool:
        return name == "flower.app" or name.startswith("flower.app.")

    users = [f"dcco.{m}" for m, path in modules.items()
             if not app(m) and any(app(t) for _, t in _imports(path, set(modules)))]
    assert not users, users
    assert {"flower.app.client_app", "flower.app.server_app", "flower.strategy",
            "flower.userapp"} <= set(modules)


def test_moved__every_old_path_imports_its_new_module_with_a_warning_naming_it():
    """A script written against the earlier layout still runs, told where each module went;
    no old path is also a module of today's (which would shadow it)."""
    import importlib
    import warnings

    import pytest

    from dcco.moved import MOVED

    modules = _modules()
    for old, new in MOVED.items():
        assert old.removeprefix("dcco.") not in modules, old
        assert new.removeprefix("dcco.") in modules, new
    probe = ("import warnings, importlib, sys; warnings.simplefilter('error'); "
             "from dcco.moved import MOVED; bad = []\n"
             "for old, new in MOVED.items():\n"
             "    try:\n        importlib.import_module(old)\n        bad.append(old)\n"
             "    except DeprecationWarning as w:\n"
             "        bad += [] if f'{old} moved to {new}' in str(w) else [str(w)]\n"
             "print(bad)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]", out
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        old = importlib.import_module("dcco.stats")
    assert old is importlib.import_module("dcco.core.stats")
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("dcco.no_such_module")
