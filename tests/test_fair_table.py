"""The fair fight's verdict words (``dcco.reproduce.verdicts``) and its final table
(experiments/fair_table.py): each word's one meaning, and the table in README and
docs/results/README.md equal to what the records give."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from dcco.reproduce.verdicts import Paired, paired

ROOT = Path(__file__).resolve().parents[1]


def _table_module():
    spec = importlib.util.spec_from_file_location("fair_table",
                                                  ROOT / "experiments" / "fair_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(("a", "b", "word"), [
    ({0: 75.0, 1: 76.0, 2: 74.5}, {0: 72.0, 1: 72.5, 2: 71.0}, "leads"),
    ({0: 72.0, 1: 72.5, 2: 71.0}, {0: 75.0, 1: 76.0, 2: 74.5}, "trails"),
    # ahead on every seed (+0.1, +2.0, +0.3), but the mean +0.8 is within 2 SE (1.2): level
    ({0: 70.1, 1: 72.0, 2: 70.4}, {0: 70.0, 1: 70.0, 2: 70.1}, "level"),
    # the MoCo at non-IID 16: +1.2 ± 1.4 over two seeds of +0.2 and +0.5 and one of
    # +2.8: ahead on every seed, the mean under 2 SE (1.6)
    ({0: 70.2, 1: 70.5, 2: 72.8}, {0: 70.0, 1: 70.0, 2: 70.0}, "level"),
    ({0: 75.0, 1: 69.0, 2: 76.0}, {0: 70.0, 1: 70.0, 2: 70.0}, "level"),  # the seeds disagree
])
def test_verdict__each_word_has_one_meaning(a, b, word) -> None:
    """"leads": ahead on every seed and the mean over twice its SE; "trails" the mirror;
    "level" every other case, including ahead on every seed by less than 2 SE."""
    d = paired(a, b)
    assert d.word == word
    assert d.floor_word() == {"leads": "passes", "trails": "under", "level": "level"}[word]


def test_verdict__pairs_only_shared_seeds_and_one_seed_gives_none() -> None:
    d = paired({0: 70.0, 1: 71.0, 5: 99.0}, {0: 68.0, 1: 68.0, 2: 10.0})
    assert d.differences == (2.0, 3.0) and d.n == 2 and d.ahead == 2
    assert d.sd == pytest.approx(0.7071, abs=1e-4) and d.se == pytest.approx(0.5)
    assert d.word == "leads" and str(d) == "+2.5 ± 0.7, ahead on 2/2"
    one = Paired((3.0,))
    assert one.word is None and one.floor_word() is None and str(one) == "+3.0, ahead on 1/1"
    assert paired({0: 1.0}, {1: 1.0}) is None


def test_verdict__t_and_two_sided_p_equal_students_t_and_holm_steps_down() -> None:
    """The paired t is mean / SE and its p is Student's two-sided p with n − 1 degrees of
    freedom (scipy's, to float rounding, for 1 to 11 degrees of freedom); Holm's correction
    keeps the i-th smallest p only while every p so far is under alpha / (m − i + 1)."""
    from scipy import stats

    from dcco.reproduce.verdicts import holm, two_sided_p

    d = paired({0: 70.0, 1: 71.0, 2: 74.0}, {0: 68.0, 1: 68.0, 2: 69.0})
    assert d.t == pytest.approx(d.mean / d.se) and d.p == pytest.approx(
        2 * stats.t.sf(d.t, 2), rel=1e-12)
    for df in range(1, 12):
        for t in (0.0, 0.3, 1.0, 2.0, 4.303, 12.7, -3.0):
            assert two_sided_p(t, df) == pytest.approx(2 * stats.t.sf(abs(t), df),
                                                       rel=1e-10, abs=1e-15)
    assert Paired((2.0, 2.0)).t == float("inf") and Paired((2.0, 2.0)).p == 0.0
    assert Paired((3.0,)).t is None and Paired((3.0,)).p is None
    assert holm([0.01, 0.04, 0.03, 0.2]) == [True, False, False, False]
    assert holm([0.001, 0.012, 0.02]) == [True, True, True]  # 0.05/3, 0.05/2, 0.05/1
    assert holm([0.001, 0.03, 0.026]) == [True, False, False]  # 0.026 > 0.05/2: it stops
    with pytest.raises(ValueError, match="positive integer"):
        two_sided_p(1.0, 0)


def test_fair_table__renders_means_seeds_collapses_and_verdicts() -> None:
    """The table from hand-made records: the mean ± sd with its seed count and collapses,
    a floor row across the settings, and the verdict against DCCO in the defined words."""
    table = _table_module()
    data = {"methods": ["dcco", "moco_fedavg"], "settings": ["non-IID 4", "non-IID 16"],
            "planned": 12, "picks": {m: {"pick": "r1", "overrides": ['optim.lr=1.0',
                                                                    'model.norm="bn"']}
                                     for m in ("dcco", "moco_fedavg")},
            "scores": {"dcco": {"non-IID 4": {0: 75.0, 1: 76.0, 2: 74.5},
                                "non-IID 16": {0: 58.0}},
                       "moco_fedavg": {"non-IID 4": {0: 72.0, 1: 72.5, 2: 71.0}}},
            "floors": {"raw pixels": {0: 80.0, 1: 80.6, 2: 80.3}},
            "versions": [{"git_commit": "abc", "cpu": "cpu A"}] * 7, "floor_versions": [],
            "norms": {"dcco": "bn", "moco_fedavg": "bn"}, "extras": {},
            "collapsed": {("dcco", "non-IID 16", 0)}}
    text = table.render(data)
    assert "| DCCO (r1: lr 1.0, bn) | 75.2 ± 0.8 (3) | 58.0 (1; 1 warned) |" in text
    assert "| *raw pixels* | 80.3 ± 0.3 (3) | 80.3 ± 0.3 (3) |" in text
    assert ("| MoCo v2 + FedAvg | -3.3 ± 0.3, ahead on 0/3 | — | **trails** "
            "(t −20.0, p 0.0025) | — |") in text
    assert ("The verdicts make 1 comparison against DCCO; at a family-wise 5 % (Holm's "
            "correction over all 1), 1 of the 1 leads and trails survive: MoCo v2 + FedAvg "
            "trails DCCO at non-IID 4.") in text
    assert "7 of the final grids' 12 cells are finished; the rest are under way" in text
    assert "-5.1 ± 0.6, ahead on 0/3, **under**" in text  # DCCO under the raw pixels


def test_fair_table__readme_and_results_show_the_table_the_records_give() -> None:
    """The block in README.md and docs/results/README.md is what experiments/fair_table.py renders
    from the committed records (rerun it with --write after adding cells)."""
    table = _table_module()
    data = table.collect()
    for name, path in table.TARGETS.items():
        block = table._block(path.read_text())
        assert block is not None, f"{path.name} has no fair-table block"
        assert block == table.render(data, brief=name == "readme").rstrip(), path.name
    assert table.main(["--check"]) == 0


def _figures_not_in_records(text: str) -> list[str]:
    """The "a ± b" figures of ``text``'s verdict section that are not a figure of the
    committed records: a method's (or floor's) mean ± sd over seeds in a setting, or the
    paired difference of two of them (mean ± sd, signed where the text gives a sign)."""
    import itertools
    import re
    import statistics

    from dcco.reproduce.verdicts import paired

    table = _table_module()
    data = table.collect()
    view = table._View(data)
    signed, unsigned = set(), set()
    for setting in view.settings:
        series = {m: view.score(m, setting) for m in data["methods"]} | {
            f: view.floor(f) for f in table.FLOORS}
        for a, b in itertools.permutations(series, 2):
            d = paired(series[a], series[b])
            if d is not None and d.n > 1:
                signed.add(f"{d.mean:+.1f} ± {d.sd:.1f}")
                unsigned.add(f"{abs(d.mean):.1f} ± {d.sd:.1f}")
        for xs in series.values():
            if len(xs) > 1:
                unsigned.add(f"{statistics.fmean(xs.values()):.1f} ± "
                             f"{statistics.stdev(xs.values()):.1f}")
    verdicts = text[text.index("## What the fair fight says"):]
    quoted = re.findall(r"([−+-]?)(\d+\.\d) ± (\d+\.\d)", verdicts)
    assert len(quoted) >= 8  # it reads the section it should
    return [f"{sign}{value} ± {sd}" for sign, value, sd in quoted
            if (f"{'+' if sign == '+' else '-'}{value} ± {sd}" not in signed if sign
                else f"{value} ± {sd}" not in unsigned)]


def test_fair_fight_prose__quotes_only_figures_the_records_give() -> None:
    """Every "a ± b" that docs/results/fair-fight.md's verdicts quote is a figure of the
    committed records (some setting's mean ± sd or paired difference: a figure that changes
    with the records, or a typo, is caught; one swapped for another real figure is not); a
    figure planted in the text is caught."""
    text = (ROOT / "docs" / "results" / "fair-fight.md").read_text()
    assert _figures_not_in_records(text) == []
    planted = text.replace("(+1.7 ± 0.9, ahead on all 3 seeds",
                           "(+1.9 ± 0.9, ahead on all 3 seeds")
    assert planted != text and _figures_not_in_records(planted) == ["+1.9 ± 0.9"]
