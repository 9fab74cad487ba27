"""The line budget: no source file in csrc/ or python/ over 1,500 lines, no test file over
2,000 (tinygrad keeps its line count in CI the same way). A file that must grow is split by
job first; docs/development.md says how the tree is laid out."""

import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCE_MAX = 1500
TEST_MAX = 2000
SOURCE_ENDINGS = (".c", ".h", ".def", ".py", ".pyi")


def _files(top, endings):
    for folder, dirs, names in os.walk(os.path.join(ROOT, top)):
        dirs[:] = [d for d in dirs if d != "__pycache__" and not d.startswith(".")]
        for name in names:
            if name.endswith(endings):
                yield os.path.join(folder, name)


def _over(paths, limit):
    over = {}
    for path in paths:
        with open(path, encoding="utf-8", errors="replace") as f:
            n = sum(1 for _ in f)
        if n > limit:
            over[os.path.relpath(path, ROOT)] = n
    return over


def test_source_files_within_1500_lines():
    paths = list(_files("csrc", SOURCE_ENDINGS)) + list(_files("python", SOURCE_ENDINGS))
    if not paths:
        pytest.skip("no csrc/ or python/ beside tests/ (an installed copy of the tests)")
    assert not _over(paths, SOURCE_MAX), "over %d lines: %s" % (SOURCE_MAX, _over(paths, SOURCE_MAX))


def test_test_files_within_2000_lines():
    paths = list(_files("tests", (".py",)))
    assert paths
    assert not _over(paths, TEST_MAX), "over %d lines: %s" % (TEST_MAX, _over(paths, TEST_MAX))


def test_the_budget_counts_what_it_should(tmp_path):
    big = tmp_path / "big.c"
    big.write_text("x\n" * (SOURCE_MAX + 1))
    small = tmp_path / "small.c"
    small.write_text("x\n" * SOURCE_MAX)
    assert _over([str(big), str(small)], SOURCE_MAX) == {os.path.relpath(str(big), ROOT): SOURCE_MAX + 1}
