"""Write docs/configuration.md from python/fastcompile/config.py's KNOBS.

    python3 tools/gen_config_docs.py           # rewrite docs/configuration.md
    python3 tools/gen_config_docs.py --check   # exit 1 if the file is stale

The table comes from each knob's static fields (env, type, default, doc), not from
``config.describe()``, whose values depend on the environment it runs in.
config.py is loaded by its path, so no build of the C extension is needed.
"""

import argparse
import importlib.util
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG_PY = os.path.join(ROOT, "python", "fastcompile", "config.py")
OUTPUT = os.path.join(ROOT, "docs", "configuration.md")
COMMAND = "python3 tools/gen_config_docs.py"

HEADER = (
    """\
<!-- GENERATED from python/fastcompile/config.py by `%s`; do not edit by hand.
     tests/test_docs.py fails when this file is stale. -->
# Configuration

Every knob lives in `python/fastcompile/config.py`. Each is read from its environment
variable when fastcompile is imported; an unset or empty variable gives the default.

- `fastcompile.config.set(name=value)` changes a knob at run time, for every thread; the C
  core reads its knobs again then (`fastcompile.config.set(num_threads=1)`).
- `with fastcompile.config.overriding(async_compile=False): ...` changes the knobs read from
  Python (`async_compile`, `async_delay_calls`, `batch_compile`, ...) for the current thread
  only, inside the block (`explain()` uses it). Knobs the C core reads cannot be overridden
  per thread.
- `fastcompile.config.describe()` lists every knob with its current value;
  `fastcompile.config.<name>` reads one.
- `torch.compile(..., backend="fastcompile", options={...})` takes any knob by name; it is
  set process-wide.

Boolean variables read `0`, `false`, `no` and `off` (any case) as false, anything else as
true. Without a home folder, the cache's last fallback is `/tmp/fastcompile-uid<uid>`.
Build switches and the test suite's variables are in [development.md](development.md);
where NVRTC and the CUDA driver are looked for, in [cuda.md](cuda.md).

| environment variable | name | type | default | meaning |
|---|---|---|---|---|
"""
    % COMMAND
)


def load_config(path=CONFIG_PY):
    """config.py as a module, loaded by its path (its module level imports only the stdlib)."""
    spec = importlib.util.spec_from_file_location("_fastcompile_config_for_docs", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _type_name(parser):
    name = getattr(parser, "__name__", repr(parser))
    return {"_bool": "bool"}.get(name, name)


def _cell(text):
    return str(text).replace("|", "\\|").replace("\n", " ")


def _default(value):
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "`%d`" % value
    return "`%s`" % value if value != "" else '`""`'


def render(config):
    """The whole of docs/configuration.md for a config module (one that has KNOBS)."""
    rows = [
        "| `%s` | `%s` | %s | %s | %s |" % (k.env, k.name, _type_name(k.type), _default(k.default), _cell(k.doc))
        for k in config.KNOBS
    ]
    return HEADER + "\n".join(rows) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/configuration.md is stale")
    args = parser.parse_args(argv)
    text = render(load_config())
    try:
        with open(OUTPUT, encoding="utf-8") as f:
            current = f.read()
    except FileNotFoundError:
        current = None
    if args.check:
        if current != text:
            print("docs/configuration.md is stale: run %s" % COMMAND, file=sys.stderr)
            return 1
        return 0
    if current != text:
        os.makedirs(os.path.dirname(OUTPUT), exist_ok=True)
        with open(OUTPUT, "w", encoding="utf-8") as f:
            f.write(text)
        print("wrote %s" % os.path.relpath(OUTPUT, ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
