"""Progress: a live bar on a terminal, a plain line now and then in a log, nothing when off."""

import io

from dcco.run.progress import Progress


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress__log_gets_a_plain_line_every_tenth_and_at_the_end():
    out = io.StringIO()
    with Progress(100, stream=out, interval=3600.0, min_gap=0.0) as bar:
        for i in range(1, 101):
            bar.update(i, loss=1.5)
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue() and "\033" not in out.getvalue()
    assert [line.split()[1] for line in lines] == [f"{10 * k}/100" for k in range(1, 11)]
    assert lines[4].startswith("round 50/100 (50%)  loss 1.5  ") and "rounds/s  ETA" in lines[4]


def test_progress__log_line_at_least_every_interval():
    out = io.StringIO()
    with Progress(1000, stream=out, interval=0.0) as bar:  # every update is past the interval
        for i in range(1, 6):
            bar.update(i)
    assert len(out.getvalue().splitlines()) == 5 + 1  # five updates and the closing line


def test_progress__resumed_run_counts_tenths_from_where_it_starts():
    out = io.StringIO()
    with Progress(10, initial=7, stream=out, interval=3600.0, min_gap=0.0) as bar:
        for i in range(8, 11):
            bar.update(i)
    assert [line.split()[1] for line in out.getvalue().splitlines()] == ["8/10", "9/10", "10/10"]


def test_progress__a_quick_phase_leaves_only_its_closing_line():
    out = io.StringIO()
    with Progress(300, label="probe step", stream=out) as bar:
        for i in range(1, 301):
            bar.update(i)
    [line] = out.getvalue().splitlines()
    assert line.startswith("probe step 300/300 (100%)")


def test_progress__disabled_is_silent_anywhere():
    for stream in (io.StringIO(), _Tty()):
        with Progress(10, stream=stream, enabled=False) as bar:
            for i in range(1, 11):
                bar.update(i, loss=1.0)
        assert stream.getvalue() == ""


def test_progress__terminal_line_shows_round_loss_rate_and_eta():
    out = _Tty()
    with Progress(10, initial=2, stream=out) as bar:
        bar.update(3, loss=0.5)
        line = bar.line()
    assert "round 3/10" in line and "loss 0.5" in line and "rounds/s" in line and "ETA" in line
    assert out.getvalue().endswith("\n") and "\r" in out.getvalue()


def test_progress__rate_unit_is_the_plural_of_the_label():
    assert "feature batches/s" in Progress(4, label="feature batch").line()
    assert "probe steps/s" in Progress(4, label="probe step").line()
