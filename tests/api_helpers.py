"""What the frontend tests (test_api*.py) share: a clean fastcompile around each test, and
the hook's cache entries of a function."""

import warnings

import pytest

import fastcompile
from fastcompile import _C
from fastcompile.api import FastcompileWarning


@pytest.fixture(autouse=True)
def clean():
    """Imported by a test module, it runs around each of its tests."""
    fastcompile.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("error", FastcompileWarning)  # an internal error must fail the test
        yield
    assert _C.set_eval_frame(None) is None, "a test left this thread's hook mode on"
    fastcompile.reset()


def entries(fn):
    """The hook's cache entries of fn's code object."""
    return _C.code_entries(fn.__code__)
