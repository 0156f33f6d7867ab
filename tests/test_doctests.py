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
