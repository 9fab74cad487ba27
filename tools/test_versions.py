"""Run the frontend tests (hook and tracer) under other CPython versions.

    python3 tools/test_versions.py 3.12 [3.13 ...] [-- extra pytest args]

For each version: find its interpreter (``python3.X`` on PATH, else pyenv's
``versions/3.X.*``), make a fresh venv under build/venv-3.X, install the
package with its test extras there (this builds the C extension for that
version), and run pytest on FRONTEND_TESTS from the repository root. The
exit status is non-zero if a version is missing, fails to install, or fails
a test: a missing interpreter is an error, never a skip.
"""

import glob
import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FRONTEND_TESTS = ["tests/test_hook.py", "tests/test_trace.py", "tests/test_api.py", "tests/test_api_values.py"]


def find_python(version):
    """The interpreter for 'X.Y', or None."""
    exe = shutil.which("python" + version)
    if exe:
        probe = subprocess.run(
            [exe, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"], capture_output=True, text=True
        )
        if probe.returncode == 0 and probe.stdout.strip() == version:
            return exe
    roots = [os.environ.get("PYENV_ROOT"), os.path.expanduser("~/.pyenv")]
    try:
        roots.insert(0, subprocess.run(["pyenv", "root"], capture_output=True, text=True).stdout.strip())
    except OSError:
        pass
    for root in filter(None, roots):
        found = sorted(glob.glob(os.path.join(root, "versions", version + ".*", "bin", "python" + version)))
        if found:
            return found[-1]
    return None


def run(cmd, **kw):
    print("+ " + " ".join(cmd), flush=True)
    return subprocess.run(cmd, **kw).returncode


def test_version(version, pytest_args):
    exe = find_python(version)
    if exe is None:
        print("test_versions: no Python %s found (PATH or pyenv)" % version, file=sys.stderr)
        return 1
    venv = os.path.join(ROOT, "build", "venv-" + version)
    shutil.rmtree(venv, ignore_errors=True)
    if run([exe, "-m", "venv", venv]) != 0:
        return 1
    py = os.path.join(venv, "bin", "python")
    if run([py, "-m", "pip", "install", "-q", "--upgrade", "pip"]) != 0:
        return 1
    if run([py, "-m", "pip", "install", "-q", ROOT + "[test]"], cwd=ROOT) != 0:
        return 1
    tests = [t for t in FRONTEND_TESTS if os.path.exists(os.path.join(ROOT, t))]
    if not tests:
        print("test_versions: none of %s exists" % FRONTEND_TESTS, file=sys.stderr)
        return 1
    return run([py, "-m", "pytest", "-q", *tests, *pytest_args], cwd=ROOT)


def main(argv):
    if "--" in argv:
        cut = argv.index("--")
        versions, pytest_args = argv[:cut], argv[cut + 1 :]
    else:
        versions, pytest_args = argv, []
    if not versions:
        print(__doc__, file=sys.stderr)
        return 2
    failed = [v for v in versions if test_version(v, pytest_args) != 0]
    if failed:
        print("test_versions: FAILED on %s" % ", ".join(failed), file=sys.stderr)
        return 1
    print("test_versions: passed on %s" % ", ".join(versions))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
