"""Rules the suite keeps about itself: no test asserts on wall-clock time (this machine is
shared and noisy, CI's CPUs differ), which a test can only keep by reading the tests."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
CLOCKS = {"perf_counter", "time", "monotonic", "perf_counter_ns", "monotonic_ns", "time_ns"}


def _is_clock_call(node: ast.AST) -> bool:
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr in CLOCKS and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "time")


def _is_elapsed(node: ast.AST, names: set[str]) -> bool:
    """``time.X() - start`` (or a name assigned one), possibly inside arithmetic."""
    if isinstance(node, ast.Name):
        return node.id in names
    if isinstance(node, ast.BinOp):
        if isinstance(node.op, ast.Sub) and (_is_clock_call(node.left)
                                             or _is_clock_call(node.right)):
            return True
        return _is_elapsed(node.left, names) or _is_elapsed(node.right, names)
    return False


def _is_number(node: ast.AST) -> bool:
    if isinstance(node, ast.UnaryOp):
        return _is_number(node.operand)
    if isinstance(node, ast.BinOp):
        return _is_number(node.left) and _is_number(node.right)
    return isinstance(node, ast.Constant) and isinstance(node.value, (int, float))


def clock_asserts(source: str) -> list[int]:
    """The lines of ``assert``s that compare an elapsed wall-clock time with a constant."""
    found = []
    for func in ast.walk(ast.parse(source)):
        if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        names: set[str] = set()
        for node in ast.walk(func):
            if isinstance(node, ast.Assign) and _is_elapsed(node.value, names):
                names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        for node in ast.walk(func):
            if not isinstance(node, ast.Assert):
                continue
            for compare in (n for n in ast.walk(node.test) if isinstance(n, ast.Compare)):
                sides = [compare.left, *compare.comparators]
                if any(_is_elapsed(a, names) for a in sides) and any(map(_is_number, sides)):
                    found.append(node.lineno)
    return sorted(set(found))


def test_clock_asserts__the_detector_finds_each_form_and_passes_a_wait():
    planted = '''
import time
def test_a():
    start = time.perf_counter()
    assert time.perf_counter() - start < 5.0
def test_b():
    t0 = time.time()
    seconds = time.time() - t0
    assert seconds < 2 * 60
def test_c():
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        pass
    assert 1 < 2
'''
    assert clock_asserts(planted) == [5, 9]


def test_no_test_asserts_on_wall_clock_time():
    offenders = {path.name: lines for path in sorted(TESTS.rglob("*.py"))
                 if (lines := clock_asserts(path.read_text()))}
    assert offenders == {}, (
        f"tests that assert on wall-clock time: {offenders}; check what the code does "
        f"(tests/helpers/counting.py) or measure it in benchmarks/")
