"""The documentation: the generated configuration page is current, the README stays short,
and every relative link in README.md and docs/*.md points to a file that exists."""

import glob
import importlib.util
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README_MAX_LINES = 150


def _generator():
    path = os.path.join(ROOT, "tools", "gen_config_docs.py")
    spec = importlib.util.spec_from_file_location("gen_config_docs", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_configuration_doc_is_current():
    # the knobs of the package under test (installed, or python/ on PYTHONPATH), not a copy
    import fastcompile.config as config

    gen = _generator()
    with open(gen.OUTPUT, encoding="utf-8") as f:
        on_disk = f.read()
    assert on_disk == gen.render(config), "docs/configuration.md is stale: run %s" % gen.COMMAND


def test_readme_is_short():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        n = len(f.read().splitlines())
    assert n <= README_MAX_LINES, "README.md has %d lines, at most %d: move detail to docs/" % (n, README_MAX_LINES)


_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def _relative_links(path):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    text = re.sub(r"```.*?```", "", text, flags=re.S)  # code blocks hold no links
    for target in _LINK.findall(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I) or target.startswith("#"):
            continue  # http:, mailto:, in-page anchors
        yield target.split("#", 1)[0]


def test_relative_links_resolve():
    pages = [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
    assert len(pages) > 1, "no docs/*.md pages"
    missing = []
    for page in pages:
        for target in _relative_links(page):
            if not os.path.exists(os.path.join(os.path.dirname(page), target)):
                missing.append("%s -> %s" % (os.path.relpath(page, ROOT), target))
    assert not missing, "broken relative links:\n" + "\n".join(missing)


def test_ci_runs_the_readme_test_command():
    # CI must call the README's test command exactly: the line that installs the test extras
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        commands = [ln.strip() for ln in f if ln.strip().startswith('python3 -m pip install ".[test')]
    assert len(commands) == 1, commands
    with open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8") as f:
        ci = [ln.strip() for ln in f]
    assert commands[0] in ci, "README's test command is not a line of .ci/run: %s" % commands[0]
