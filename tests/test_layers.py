"""The package's shape (docs/architecture.md): dependencies flow one way, from the core up to
the command line, never back; the top level stays short; no module outgrows one job."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "dcco"

LAYERS = (
    ("errors", "files", "tensorfile", "config", "moved", "version", "callers"),
    ("core", "core.seeding", "core.devices"),
    ("core.stats", "core.losses", "core.collapse", "core.method"),
    ("methods", "models", "data", "evaluate", "core.client", "core.server", "core.optim",
     "core.privacy", "core.precision", "core.statistics_cache", "core.client_state",
     "core.disk_states"),
    ("core.aggregation", "core.algorithm", "core.simulator", "core.distributed"),
    ("run", "reproduce", "flower", "round_parts", "api", "fitting"),
    ("cli", "demo", "__main__", "__init__"),
)
"""The layers, lowest first: a module may import its own layer and those below, never one
above (the longest matching name decides a module's layer)."""


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
    relative ``import``/``from ... import``, ``import dcco`` itself (the package's top,
    ``__init__``), and ``importlib.import_module`` or ``__import__`` under any name of a
    constant name (a computed name, which no reader can place, counts as ``__init__``, the
    top); function-level ones included, those under ``if TYPE_CHECKING:`` (names for
    annotations) left out. ``from dcco.core import stats`` is an import of ``core.stats``."""
    tree = ast.parse(source)
    skipped = {id(n) for node in ast.walk(tree)
               if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING"
               for n in ast.walk(node)}
    package = name.split(".")[:-1]  # a module's package (an __init__'s is its own)
    found = []
    importers = {"import_module", "__import__"}  # the names an importer goes by here
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "importlib":
            importers |= {a.asname for a in node.names if a.name == "import_module" and a.asname}
        elif isinstance(node, ast.Assign) and getattr(node.value, "attr", "") == "import_module":
            importers |= {t.id for t in node.targets if isinstance(t, ast.Name)}

    def named(line: int, base: str, names: list[str]) -> None:
        for a in names:
            sub = f"{base}.{a}" if base else a
            if sub in modules:
                found.append((line, sub))
            else:  # a name of a package: of dcco's top (its __init__, e.g. ``fit``) if none
                found.append((line, base or "__init__"))

    def constant(node: ast.Call, position: int, keyword: str) -> ast.expr | None:
        """An importer call's argument, given by position or by keyword."""
        if len(node.args) > position:
            return node.args[position]
        return next((k.value for k in node.keywords if k.arg == keyword), None)

    def dotted(target: ast.expr | None, package: ast.expr | None) -> str | None:
        """The dcco module an importer's (name, package) names: below ``dcco`` ("cli"),
        "__init__" for dcco itself or a name no reader can place, None outside dcco."""
        if not (isinstance(target, ast.Constant) and isinstance(target.value, str)):
            return "__init__"  # computed: it could be anything
        text = target.value
        if text.startswith("."):  # relative to ``package``
            if not (isinstance(package, ast.Constant) and isinstance(package.value, str)):
                return "__init__"
            text = package.value + text if text.count(".") == 1 else text
            if text.startswith("."):  # more levels up than this test resolves
                return "__init__"
        if text == "dcco":
            return "__init__"
        return text.removeprefix("dcco.") if text.startswith("dcco.") else None

    def is_sys_modules(node: ast.expr) -> bool:
        return (isinstance(node, ast.Attribute) and node.attr == "modules"
                and getattr(node.value, "id", "") == "sys") or getattr(node, "id", "") in (
            module_aliases)

    module_aliases = {a.asname or a.name for node in ast.walk(tree)
                      if isinstance(node, ast.ImportFrom) and node.module == "sys"
                      for a in node.names if a.name == "modules"}

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
            found += [(node.lineno, "__init__") for a in node.names if a.name == "dcco"]
        elif (isinstance(node, ast.Call)
              and (getattr(node.func, "attr", None) == "import_module"
                   or getattr(node.func, "id", None) in importers)):
            target = dotted(constant(node, 0, "name"), constant(node, 1, "package"))
            if target is not None:
                found.append((node.lineno, target))
        elif isinstance(node, ast.Subscript) and is_sys_modules(node.value):
            # a module already loaded, taken from ``sys.modules["dcco..."]``
            target = dotted(node.slice, None)
            if target is not None:
                found.append((node.lineno, target))
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "get"
              and is_sys_modules(node.func.value) and node.args):
            target = dotted(node.args[0], None)
            if target is not None:
                found.append((node.lineno, target))
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
        "import dcco": "__init__",
        "def later():\n    import dcco as d": "__init__",
        "__import__('dcco.cli')": "cli",
        "from importlib import import_module as im\nim('dcco.run.loop')": "run.loop",
        "import importlib as il\nil.import_module('dcco.api')": "api",
        "import importlib\nload = importlib.import_module\nload('dcco.cli')": "cli",
        "import importlib\nimportlib.import_module('dcco.' + name)": "__init__",
        "__import__(f'dcco.{name}')": "__init__",
        # the five that once passed (issue 100): a name of dcco's top, loaded through its
        # __getattr__; the same, relative; importlib by keyword; importlib relative to a
        # package; a module taken from sys.modules
        "from dcco import fit": "__init__",
        "from .. import fit": "__init__",
        "import importlib\nimportlib.import_module(name='dcco.cli')": "cli",
        "import importlib\nimportlib.import_module('.cli', 'dcco')": "cli",
        "import sys\nsys.modules['dcco'].fit": "__init__",
        "import sys\nsys.modules.get('dcco.cli')": "cli",
        "from sys import modules\nmodules['dcco.run.loop']": "run.loop",
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


COMPUTED = {"moved": "the old-path shim: it imports, when an old name is asked for, the "
                     "new module its MOVED and MOVED_NAMES tables name"}
"""The modules allowed a computed import, and why."""


def test_layers__no_module_imports_a_layer_above_its_own():
    upward, modules = [], _modules()
    for module, path in modules.items():
        found = _imports(path, set(modules))
        if module in COMPUTED:  # its computed imports only: a constant one is still read
            computed = {n.lineno for n in ast.walk(ast.parse(path.read_text()))
                        if isinstance(n, ast.Call) and n.args
                        and not isinstance(n.args[0], ast.Constant)}
            found = [(line, t) for line, t in found if line not in computed]
        upward += _upward(module, found)
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
    assert all(m in ("dcco", "dcco.errors", "dcco.moved", "dcco.version")
               or m.startswith("dcco.config")
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
    for refuse in (validate, lambda c: Pretraining.of(c, None),
                   lambda c: RunDir.create(tmp_path / "run", c)):
        with pytest.raises(ConfigError, match=match):
            refuse(cfg)
    assert not (tmp_path / "run").exists()
    assert validate(RunConfig(train=TrainConfig(method="fedsc", absent_statistics="cached")))

def test_layers__the_core_imports_nothing_from_the_methods():
    """The round needs a method's protocol, not its code: ``Method`` and ``Segments`` live in
    ``dcco.core.method``, and no module of the core imports ``dcco.methods``."""
    modules = _modules()
    found = [f"dcco.{m} imports dcco.{t} (line {line})"
             for m, path in modules.items() if m == "core" or m.startswith("core.")
             for line, t in _imports(path, set(modules))
             if t == "methods" or t.startswith("methods.")]
    assert not found, found


def test_layers__each_config_class_has_one_import_path():
    """Code, tests and docs import a config class (``LossConfig``, ``RunConfig``, ...) from
    ``dcco.config`` alone (its submodules only inside the config); an old path still gives
    the class, with a ``DeprecationWarning`` that names ``dcco.config``."""
    import importlib
    import re
    import warnings

    import dcco.config
    from dcco.moved import CONFIG_CLASSES, MOVED_NAMES

    root = PACKAGE.parents[1]
    wrong = []
    for folder in ("src", "tests", "benchmarks", "experiments", "examples", "docs"):
        for path in (root / folder).rglob("*"):
            if path.suffix not in (".py", ".md") or "src/dcco/config" in path.as_posix():
                continue
            text = path.read_text()
            sources = ([text] if path.suffix == ".py"
                       else re.findall(r"```python\n(.*?)```", text, re.DOTALL))
            for source in sources:
                for node in ast.walk(ast.parse(source)):
                    if (isinstance(node, ast.ImportFrom) and node.module
                            and node.module.startswith("dcco") and node.module != "dcco.config"
                            and {a.name for a in node.names} & set(CONFIG_CLASSES)):
                        wrong.append(f"{path.relative_to(root)}:{node.lineno}: from "
                                     f"{node.module} import ...")
    assert not wrong, "\n".join(wrong)
    assert set(CONFIG_CLASSES) <= set(dcco.config.__all__)
    for module, names in MOVED_NAMES.items():
        for name in names:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                value = getattr(importlib.import_module(module), name)
            assert value is getattr(dcco.config, name), (module, name)
            if name not in vars(importlib.import_module(module)):
                assert any(f"{module}.{name} moved to dcco.config.{name}" in str(w.message)
                           for w in caught), (module, name)


def test_layers__one_run_round():
    """One function is called ``run_round`` (the simulator's: a round on a model and its
    views); the algorithm's round on an executor is ``Algorithm.round``, and its old name
    warns."""
    import warnings

    from dcco.core.algorithm import Algorithm

    defined = sorted(f"dcco.{m}:{node.lineno}" for m, path in _modules().items()
                     for node in ast.walk(ast.parse(path.read_text()))
                     if isinstance(node, ast.FunctionDef) and node.name == "run_round"
                     and "DeprecationWarning" not in ast.unparse(node))
    assert defined == [d for d in defined if d.startswith("dcco.core.simulator:")], defined
    assert len(defined) == 1, defined

    class Once(Algorithm):
        def round(self, *args):
            return args

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert Once.__new__(Once).run_round("executor") == ("executor", None, None, None)
    assert any("Algorithm.run_round is now Algorithm.round" in str(w.message) for w in caught)


def test_layers__run_rounds_is_split_by_job_and_its_old_names_warn():
    """``dcco.run.rounds`` held six jobs; each name now lives in the module of its job, and
    the old import of a name the docs showed gives it with a ``DeprecationWarning`` naming
    that module."""
    import importlib
    import warnings

    from dcco.run import rounds

    assert set(rounds.MOVED_TO.values()) == {"dcco.run.planning", "dcco.run.sampling"}
    for name, module in rounds.MOVED_TO.items():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            value = getattr(rounds, name)
        assert value is getattr(importlib.import_module(module), name)
        assert any(f"moved to {module}.{name}" in str(w.message) for w in caught), name


def test_layers__the_test_sees_an_upward_import():
    """The check above is not vacuous: a core module importing the loop is caught."""
    assert _layer("core.stats") < _layer("run.loop")
    assert _layer("evaluate.knn") < _layer("run.evaluations") == _layer("run.rundir")
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


def test_layers__no_import_circle_in_flower():
    """No module of ``dcco.flower`` reaches itself through its imports, counting those made
    inside functions and under ``TYPE_CHECKING`` too, and a package's ``__init__`` as run by
    an import of any module under it (the strategy's phases sit below ``strategy``, the
    messages' layout below both)."""
    modules = _modules()
    flower = {m for m in modules if m == "flower" or m.startswith("flower.")}
    graph: dict[str, set[str]] = {}
    for m in flower:
        source = modules[m].read_text().replace("if TYPE_CHECKING:", "if True:")
        reached = set()
        for _, target in _imports_of(source, m, set(modules)):
            parts = target.split(".")
            reached |= {".".join(parts[:i]) for i in range(2, len(parts) + 1)}
        graph[m] = {t for t in reached & flower if t != m and not m.startswith(t + ".")}
    circles = []

    def walk(node: str, path: list[str], done: set[str]) -> None:
        for nxt in sorted(graph[node]):
            if nxt in path:
                circles.append(" -> ".join(path[path.index(nxt):] + [nxt]))
            elif nxt not in done:
                walk(nxt, path + [nxt], done)
        done.add(node)

    seen: set[str] = set()
    for m in sorted(flower):
        if m not in seen:
            walk(m, [m], seen)
    assert not circles, "\n".join(sorted(set(circles))[:10])
    assert len(modules["flower.strategy.strategy"].read_text().splitlines()) < 300


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
    probe = ("import warnings, importlib, sys\n"
             "from dcco.moved import MOVED; bad = []\n"
             "with warnings.catch_warnings():\n"  # the parents first: flwr's own warnings
             "    warnings.simplefilter('ignore')\n"
             "    for old in MOVED: importlib.import_module(old.rpartition('.')[0])\n"
             "warnings.simplefilter('error')\n"
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


REMOVED_PATHS = ("dcco.config_reference", "dcco.flower.strategy_checkpoint", "dcco.image_views",
                 "dcco.models.config", "dcco.scalars")
"""Old module paths that only dcco itself ever imported: cut, with no shim (CHANGELOG.md)."""
REMOVED_NAMES = {
    "dcco.core.privacy": ("PrivacyConfig",), "dcco.data": ("TableConfig",),
    "dcco.evaluate": ("EvalConfig",),
    "dcco.evaluate.settings": ("EvalConfig",), "dcco.methods": ("LossConfig",),
    "dcco.models": ("ModelConfig",), "dcco.flower.strategy": ("DCCO",),
    "dcco.run.rounds": ("Privacy", "RoundPlan", "algorithm_of", "centralized_batch",
                        "fedsc_alpha", "input_record", "keeps_graphs", "max_batch_of",
                        "plan_round", "resolve_device", "user_views")}
"""Old names that no page or docstring showed: cut, with no shim (CHANGELOG.md)."""


def test_moved__only_what_a_user_was_shown_keeps_a_shim():
    """The old paths and names that README, docs/ or a docstring showed keep their
    deprecation; those only dcco's own code imported are gone, and asking for one fails as
    for any name that never existed."""
    import importlib

    import pytest

    from dcco.moved import MOVED, MOVED_NAMES
    from dcco.run import rounds

    for old in REMOVED_PATHS:
        assert old not in MOVED
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module(old)
    for module, names in REMOVED_NAMES.items():
        for name in names:
            assert name not in MOVED_NAMES.get(module, ()) and name not in rounds.MOVED_TO
            with pytest.raises(AttributeError, match=f"has no attribute '{name}'"):
                getattr(importlib.import_module(module), name)
    assert set(rounds.MOVED_TO) == {"build_partition", "clients_seen", "sample_clients"}


def test_version__one_constant_equal_to_pyprojects():
    """``dcco.version`` holds the release that ``pyproject.toml`` declares; the package's top
    and the run directory's record read it from there."""
    import tomllib

    import dcco
    from dcco.version import __version__

    declared = tomllib.loads((PACKAGE.parents[1] / "pyproject.toml").read_text())
    assert __version__ == declared["project"]["version"] == dcco.__version__


def test_layers__the_run_loop_hands_its_jobs_to_monitors():
    """``pretraining_loop`` stays a loop (under 60 lines): the collapse watch, privacy, the
    k-NN and probe monitors and checkpoints are each a ``Monitor`` of ``dcco.run.monitors``,
    and a run with all of them on gets one of each, checkpoints last."""
    import inspect

    from dcco.run import loop, monitors

    lines, _ = inspect.getsourcelines(loop.pretraining_loop)
    assert len(lines) < 60, len(lines)
    jobs = (monitors.Collapse, monitors.PrivacyBudget, monitors.KnnMonitor,
            monitors.ProbeMonitor, monitors.Checkpoints)
    assert all(issubclass(job, monitors.Monitor) for job in jobs)
    import re

    source = inspect.getsource(loop)
    for job in jobs:  # the loop reaches them only through the list
        assert not re.search(rf"\b{job.__name__}\b", source), job.__name__


def test_layers__no_two_modules_share_a_file_name():
    """A file's name says its layer where two would otherwise clash (docs/architecture.md):
    apart from the packages' ``__init__.py`` and ``__main__.py``, every file name in
    ``src/dcco`` is its own; the renamed modules' old paths import with a warning."""
    import importlib
    import warnings
    from collections import Counter

    names = Counter(path.name for path in PACKAGE.rglob("*.py"))
    shared = sorted(n for n, count in names.items()
                    if count > 1 and n not in ("__init__.py", "__main__.py"))
    assert not shared, shared
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        old = importlib.import_module("dcco.flower.strategy.rounds")
    assert old is importlib.import_module("dcco.flower.strategy.round_steps")
    assert any("moved to dcco.flower.strategy.round_steps" in str(w.message) for w in caught)


def test_layers__the_do_everything_functions_are_short_sequences_of_named_steps():
    """``dcco.flower.answer``, ``dcco.fit`` and ``client_update`` stay under 60 lines of code
    each (their docstrings aside): their steps are functions with names of their own."""
    import inspect

    from dcco.core.client import client_update
    from dcco.fitting import fit
    from dcco.flower.userapp import answer

    for function in (answer, fit, client_update):
        node = ast.parse(inspect.getsource(function)).body[0]
        body = node.body[1:] if isinstance(node.body[0], ast.Expr) else node.body
        lines = body[-1].end_lineno - body[0].lineno + 1
        assert lines < 60, (function.__name__, lines)


def test_layers__no_internal_module_imports_the_public_api():
    """``dcco.api`` is the users' surface, re-exporting dcco's parts; dcco's own modules
    import those parts from where they live (``dcco.round_parts``,
    ``dcco.models.user_encoder``, ``dcco.models.dual_views``), never from ``dcco.api``."""
    modules = _modules()
    users = sorted(f"dcco.{m} (line {line})" for m, path in modules.items()
                   if m not in ("api", "__init__")
                   for line, target in _imports(path, set(modules)) if target == "api")
    assert not users, users
