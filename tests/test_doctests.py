"""The ``>>>`` examples of the public API's main entries run as written (doctest): what
``help()`` shows a user works."""

from __future__ import annotations

import doctest

import pytest

import dcco
import dcco.flower

ENTRIES = {"dcco.fit": dcco.fit, "dcco.dual_encoder": dcco.dual_encoder,
           "dcco.linear_probe": dcco.linear_probe, "dcco.load_encoder": dcco.load_encoder,
           "dcco.flower.answer": dcco.flower.answer,
           "dcco.flower.DCCOStrategy": dcco.flower.DCCOStrategy,
           "dcco.flower.knn_evaluation": dcco.flower.knn_evaluation}


@pytest.mark.parametrize("name", list(ENTRIES))
def test_doctest__the_entrys_example_runs_as_written(name, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # an example's run directory, if it makes one, lands here
    entry = ENTRIES[name]
    tests = [t for t in doctest.DocTestFinder(recurse=False).find(entry, name)
             if t.examples]
    assert tests, f"{name} has no >>> example"
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for test in tests:
        runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.attempted >= 3 and result.failed == 0, f"{name}: {result}"


LOSSES = ("byol_loss", "cco_loss", "clip_loss", "moco_loss", "nt_xent_loss", "simsiam_loss",
          "spectral_loss", "vicreg_loss")
"""``dcco.core.losses``: one loss a file, each with its examples."""
MODULES = (*(f"dcco.core.losses.{name}" for name in LOSSES), "dcco.core.aggregation",
           "dcco.errors", "dcco.flower.forward_cache", "dcco.reproduce.verdicts",
           "dcco.flower.secagg")


@pytest.mark.parametrize("name", MODULES)
def test_doctest__a_modules_examples_run_as_written(name) -> None:
    """Every ``>>>`` example of the module runs as written; each loss's file has one."""
    import importlib

    module = importlib.import_module(name)
    tests = [t for t in doctest.DocTestFinder().find(module, name) if t.examples]
    assert tests, f"{name} has no >>> example"
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for test in tests:
        runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, f"{name}: {result}"


def test_losses__one_loss_a_file_and_every_file_listed() -> None:
    from pathlib import Path

    from dcco.core import losses

    files = sorted(p.stem for p in Path(losses.__file__).parent.glob("*.py")
                   if p.stem != "__init__")
    assert tuple(files) == LOSSES
