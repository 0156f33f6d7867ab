"""The progress bar: live on a terminal, silent otherwise."""

import io

from dcco.progress import Progress


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress__silent_when_not_a_terminal():
    out = io.StringIO()
    with Progress(10, stream=out) as bar:
        for i in range(1, 11):
            bar.update(i, loss=1.0)
    assert out.getvalue() == ""


def test_progress__terminal_line_shows_round_loss_rate_and_eta():
    out = _Tty()
    with Progress(10, initial=2, stream=out) as bar:
        bar.update(3, loss=0.5)
        line = bar.line()
    assert "round 3/10" in line and "loss 0.5" in line and "rounds/s" in line and "ETA" in line
    assert out.getvalue().endswith("\n") and "\r" in out.getvalue()
