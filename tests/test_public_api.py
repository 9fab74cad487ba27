"""The public surface: the names fastcompile exports, each function with type hints, and the
graph API's stub beside its module (its types are C types, which carry no annotations)."""

import inspect
import os
import typing

import fastcompile

PUBLIC_FUNCTIONS = {
    "compile": fastcompile.compile,
    "explain": fastcompile.explain,
    "reset": fastcompile.reset,
    "profile": fastcompile.profile,
    "stats": fastcompile.stats,
    "config.get": fastcompile.config.get,
    "config.set": fastcompile.config.set,
    "config.describe": fastcompile.config.describe,
}


def test_exported_names():
    for name in ("compile", "explain", "reset", "config", "graph", "profile", "stats"):
        assert name in fastcompile.__all__ and hasattr(fastcompile, name), name


def test_public_functions_are_annotated():
    for name, fn in PUBLIC_FUNCTIONS.items():
        hints = typing.get_type_hints(fn)
        assert "return" in hints, name
        params = [p for p in inspect.signature(fn).parameters.values() if p.name != "self"]
        missing = [p.name for p in params if p.name not in hints]
        assert not missing, (name, missing)


def test_graph_stub_and_marker_ship_with_the_package():
    here = os.path.dirname(fastcompile.__file__)
    assert os.path.exists(os.path.join(here, "py.typed"))
    with open(os.path.join(here, "graph.pyi")) as f:
        stub = f.read()
    for name in ("class Graph", "class Value", "class Compiled", "def ops("):
        assert name in stub, name
    g = fastcompile.graph.Graph()
    for method in ("input", "constant", "call", "extern", "output", "compile"):
        assert hasattr(g, method) and ("def %s(" % method) in stub, method


def test_config_set_takes_paths_and_is_all_or_nothing(tmp_path):
    import pathlib

    cfg = fastcompile.config
    old = cfg.get("nvrtc"), cfg.get("num_threads")
    try:
        cfg.set(nvrtc=pathlib.Path(tmp_path))  # os.PathLike, as cache_dir and cc take
        assert cfg.resolved()["nvrtc"] == str(tmp_path)
        try:
            cfg.set(num_threads=old[1] + 1, nvrtc=12)
        except TypeError:
            pass
        else:
            raise AssertionError("an int for nvrtc was taken")
        # the refused call changed nothing, and later calls still work
        assert cfg.get("nvrtc") == pathlib.Path(tmp_path) and cfg.get("num_threads") == old[1]
        cfg.set(num_threads=old[1])
    finally:
        cfg.set(nvrtc=old[0], num_threads=old[1])
