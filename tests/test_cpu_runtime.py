"""CPU runtime (csrc/runtime/cpu.c, pool.c, ...): C source -> private disk cache -> dlopen'd kernel.

Everything goes through the test hook ``_C._cpu_load(source, symbol)``, which
returns {"so_path", "c_path", "key", "fn"}. Each test uses its own cache folder
and its own kernel source (the in-memory table is process-wide), and runs the
"other process" side of a scenario in a real subprocess.
"""

import ctypes
import hashlib
import json
import logging
import os
import re
import shutil
import stat
import subprocess
import sys
import textwrap
import threading
import time
import uuid
import warnings

import pytest

from conftest import NO_TORCH
from fastcompile import _C

INCLUDE = os.path.join(os.path.dirname(_C.__file__), "include")
PKG_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(_C.__file__)))
CC = shutil.which("cc") or shutil.which("gcc")
KERNEL_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)

pytestmark = pytest.mark.skipif(CC is None, reason="no C compiler")


def kernel(ret=42, tag=None, include="fc_launch.h", body=""):
    """A unique, valid kernel source: fc_k runs `body` (C statements) and returns `ret`;
    `include` is the header it starts with (fc_kernel.h for the kernels' helpers)."""
    return (
        textwrap.dedent(f"""\
        #include "{include}"
        /* test kernel {tag or uuid.uuid4().hex} */
        __attribute__((visibility("default"))) int fc_k(const fc_launch *L)
        {{
            (void)L;
        """)
        + textwrap.indent(textwrap.dedent(body), "    ")
        + f"    return {ret};\n}}\n"
    )


def call(res):
    return KERNEL_FN(res["fn"])(None)


def mapped_inode(addr):
    """The inode of the file mapped at `addr` in this process."""
    for line in open("/proc/self/maps"):
        f = line.split()
        lo, hi = (int(x, 16) for x in f[0].split("-"))
        if lo <= addr < hi:
            return int(f[4])
    raise AssertionError("address not mapped")


def make_cfg(cache_dir, **over):
    """The precompiled header is off unless a test asks for it (pch=True): the
    tests here count compiler runs, and the header build is one more."""
    cfg = {
        "cc": CC,
        "cflags": "",
        "include_dir": INCLUDE,
        "cache_dir": str(cache_dir),
        "version": "test-1",
        "always_compile": False,
        "debug": 0,
        "dump_dir": None,
        "pch": False,
    }
    cfg.update(over)
    return cfg


def stats_delta(before):
    after = _C.stats()
    return {k: after[k] - before[k] for k in ("compiles", "disk_hits", "memory_hits")}


def runs_delta(before):
    """Compiler processes run for kernels since `before` (a bundle of kernels takes one)."""
    return _C.stats()["compiler_runs"] - before["compiler_runs"]


@pytest.fixture(autouse=True)
def _restore_config():
    """Each test points the runtime at its own folder; put the real config back."""
    yield
    import fastcompile
    from fastcompile import config

    _C._configure(dict(config.resolved(), version=getattr(fastcompile, "__version__", None)))


@pytest.fixture
def cache(tmp_path):
    d = tmp_path / "cache"
    _C._configure(make_cfg(d))
    return d


CHILD = (
    NO_TORCH
    + r"""
import json, sys, warnings, os, time, ctypes
sys.path.insert(0, sys.argv[1])
from fastcompile import _C
job = json.load(open(sys.argv[2]))
_C._configure(job["cfg"])
if job.get("start_file"):
    open(job["start_file"] + ".ready.%d" % os.getpid(), "w").close()   # at the line
    while not os.path.exists(job["start_file"]):
        time.sleep(0.001)
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    try:
        res = _C._cpu_load(job["source"], "fc_k")
        ret = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)(res["fn"])(None)
        err = None
    except Exception as e:
        res, ret, err = None, None, repr(e)
print(json.dumps({"res": res, "ret": ret, "err": err, "stats": _C.stats(),
                  "warnings": [str(x.message) for x in w]}))
"""
)


def child(tmp_path, cfg, source, start_file=None, wait=True):
    """Run one load in a fresh interpreter; returns its JSON report (or the Popen)."""
    script = tmp_path / "child.py"
    if not script.exists():
        script.write_text(CHILD)
    job = tmp_path / f"job-{uuid.uuid4().hex}.json"
    job.write_text(json.dumps({"cfg": cfg, "source": source, "start_file": start_file}))
    p = subprocess.Popen(
        [sys.executable, str(script), PKG_ROOT, str(job)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    if not wait:
        return p
    return finish(p)


def wait_ready(start_file, procs, timeout=300):
    """Until every child waits at the start line (each has written start_file.ready.<pid>)."""
    deadline = time.monotonic() + timeout
    while True:
        ready = [
            f for f in os.listdir(os.path.dirname(start_file)) if f.startswith(os.path.basename(start_file) + ".ready.")
        ]
        if len(ready) >= len(procs) or any(p.poll() is not None for p in procs):
            return  # all at the line (or one died: finish() reports its stderr)
        if time.monotonic() > deadline:
            for p in procs:
                p.kill()
            raise AssertionError("children not ready after %d s" % timeout)
        time.sleep(0.01)


def finish(p):
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


def fake_cc(tmp_path, body, name="cc"):
    """A shell-script compiler; `body` runs with the compiler's arguments in $@."""
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return str(path)


# ---------------------------------------------------------------------------
# compile, memory hit, disk hit
# ---------------------------------------------------------------------------


def test_compile_then_memory_hit(cache):
    src = kernel(7)
    before = _C.stats()
    r1 = _C._cpu_load(src, "fc_k")
    assert stats_delta(before) == {"compiles": 1, "disk_hits": 0, "memory_hits": 0}
    assert call(r1) == 7
    assert re.fullmatch(r"[0-9a-f]{64}", r1["key"])
    assert r1["so_path"] == str(cache / r1["key"][:2] / (r1["key"] + ".so"))
    assert r1["c_path"] == str(cache / r1["key"][:2] / (r1["key"] + ".c"))
    r2 = _C._cpu_load(src, "fc_k")
    assert stats_delta(before) == {"compiles": 1, "disk_hits": 0, "memory_hits": 1}
    assert r2 == r1


def test_disk_layout_and_sidecar(cache):
    src = kernel(1)
    r = _C._cpu_load(src, "fc_k")
    key = r["key"]
    shard = cache / key[:2]
    assert sorted(os.listdir(shard)) == sorted([key + ".so", key + ".c", key + ".meta"])
    assert stat.S_IMODE(os.stat(cache).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(shard).st_mode) == 0o700
    assert open(r["c_path"]).read() == src
    meta = (shard / (key + ".meta")).read_text()
    so_hash = hashlib.sha256(open(r["so_path"], "rb").read()).hexdigest()
    assert f"key {key}\n" in meta
    assert f"so_sha256 {so_hash}\n" in meta
    assert "version test-1\n" in meta
    assert _C.stats()["cache_dir"] == str(cache)


def test_fresh_process_warm_start_spawns_nothing(tmp_path):
    """A fresh process with a warm disk cache runs no compiler at all, not
    even `cc --version` (the probe result is cached beside the kernels)."""
    log = tmp_path / "cc.log"
    cc = fake_cc(tmp_path, f'echo "$@" >> {log}\nexec {CC} "$@"\n')
    cfg = make_cfg(tmp_path / "cache", cc=cc)
    src = kernel(5)
    a = child(tmp_path, cfg, src)
    assert a["err"] is None and a["ret"] == 5
    assert a["stats"]["compiles"] == 1 and a["stats"]["disk_hits"] == 0
    calls = log.read_text().splitlines()
    assert len(calls) == 2 and calls[0] == "--version"
    b = child(tmp_path, cfg, src)
    assert b["err"] is None and b["ret"] == 5 and b["warnings"] == []
    assert b["stats"]["compiles"] == 0 and b["stats"]["disk_hits"] == 1
    assert b["res"] == a["res"] | {"fn": b["res"]["fn"]}
    assert log.read_text().splitlines() == calls


def expected_vector_width():
    """What the compile line should carry on this machine: 512 on an AMD CPU
    with AVX-512 (full clock at 512 bits) or an Intel CPU with AVX512-VBMI2
    (Ice Lake on: little or no clock drop), 256 on any other x86-64 CPU."""
    if os.uname().machine != "x86_64":
        return None
    text = open("/proc/cpuinfo").read()
    flags = re.search(r"^flags\s*:(.*)$", text, re.M).group(1).split()
    amd = re.search(r"^vendor_id\s*:\s*AuthenticAMD\s*$", text, re.M) is not None
    intel = re.search(r"^vendor_id\s*:\s*GenuineIntel\s*$", text, re.M) is not None
    return 512 if "avx512f" in flags and (amd or (intel and "avx512_vbmi2" in flags)) else 256


def test_vector_width_on_the_compile_line(tmp_path):
    log = tmp_path / "cc.log"
    cc = fake_cc(tmp_path, f'echo "$@" >> {log}\nexec {CC} "$@"\n')
    _C._configure(make_cfg(tmp_path / "cache", cc=cc, pch=False))
    assert call(_C._cpu_load(kernel(3), "fc_k")) == 3
    line = [c for c in log.read_text().splitlines() if c != "--version"]
    assert len(line) == 1
    widths = re.findall(r"-mprefer-vector-width=(\d+)", line[0])
    bits = re.findall(r"-DFC_VECTOR_BITS=(\d+)", line[0])
    want = expected_vector_width()
    assert widths == ([] if want is None else [str(want)])
    assert bits == widths, "fc_kernel.h is told the same width the compiler is"


def test_reduction_lanes_follow_the_vector_width(tmp_path):
    """fc_kernel.h's FC_LANES, as a kernel built here sees it: one vector of float32."""
    _C._configure(make_cfg(tmp_path / "cache"))
    want = expected_vector_width()
    assert call(_C._cpu_load(kernel("FC_LANES", include="fc_kernel.h"), "fc_k")) == (8 if want is None else want // 32)


def test_thread_shares_of_rows_and_elements(tmp_path):
    """fc_thread_range: a reduction's rows split evenly (97 rows on 2 threads: 49 + 48), elements
    in whole 16-element steps (97: 64 + 33, so a share starts on a cache line of float32)."""
    _C._configure(make_cfg(tmp_path / "cache"))
    body = """
        int64_t a0, a1, b0, b1, c0, c1, d0, d1;
        fc_thread_range(97, 1, 0, 2, &a0, &a1);
        fc_thread_range(97, 1, 1, 2, &b0, &b1);
        fc_thread_range(97, 16, 0, 2, &c0, &c1);
        fc_thread_range(97, 16, 1, 2, &d0, &d1);
        if (a0 != 0 || b1 != 97 || c0 != 0 || d1 != 97) {
            return -1;
        }
        """
    src = kernel("(int)(a1 * 1000000 + b0 * 10000 + c1 * 100 + d0)", include="fc_kernel.h", body=body)
    assert call(_C._cpu_load(src, "fc_k")) == 49496464


def test_always_compile_skips_disk_reads(tmp_path):
    cfg = make_cfg(tmp_path / "cache")
    src = kernel(3)
    assert child(tmp_path, cfg, src)["stats"]["compiles"] == 1
    ino = os.stat(child(tmp_path, cfg, src)["res"]["so_path"]).st_ino
    c = child(tmp_path, dict(cfg, always_compile=True), src)
    assert c["err"] is None and c["ret"] == 3 and c["warnings"] == []
    assert c["stats"]["compiles"] == 1 and c["stats"]["disk_hits"] == 0
    # the published file is never replaced by a good one's twin
    assert os.stat(c["res"]["so_path"]).st_ino == ino


# ---------------------------------------------------------------------------
# the key: every component flips it
# ---------------------------------------------------------------------------


def test_key_components_flip(tmp_path):
    inc = tmp_path / "include"
    shutil.copytree(INCLUDE, inc)
    base = make_cfg(tmp_path / "cache", include_dir=str(inc))
    src = kernel(9)
    cc2 = fake_cc(tmp_path, f'exec {CC} "$@"\n', name="cc2")

    def key(cfg, source=src):
        _C._configure(cfg)
        before = _C.stats()
        r = _C._cpu_load(source, "fc_k")
        assert call(r) == (9 if source == src else 10)
        return r["key"], stats_delta(before)["compiles"]

    k0, n0 = key(base)
    assert key(base) == (k0, 0)  # stable
    flips = [
        key(dict(base, cflags="-DFC_TEST_FLIP=1")),  # flags
        key(dict(base, version="test-2")),  # fastcompile version
        key(dict(base, cc=cc2)),  # compiler path
        key(base, src.replace("return 9", "return 10")),  # source
    ]
    with open(inc / "fc_launch.h", "a") as f:  # shipped header bytes
        f.write("\n/* edited */\n")
    flips.append(key(base))
    keys = [k for k, _ in flips]
    assert k0 not in keys and len(set(keys)) == len(keys)
    assert all(n == 1 for _, n in flips)
    # a second process computes the same key for the same inputs
    assert child(tmp_path, base, src)["res"]["key"] == keys[-1]


def test_leading_comment_is_not_in_the_key(cache):
    """gen_c's header comment names the caller's file:line; the same code from
    two call sites is one kernel. Code after the header still counts."""
    body = kernel(8)
    before = _C.stats()
    a = _C._cpu_load("/* from a.py:1 */\n// more\n" + body, "fc_k")
    b = _C._cpu_load("/* from b.py:2\n * two lines */\n" + body, "fc_k")
    assert a["key"] == b["key"]
    assert stats_delta(before) == {"compiles": 1, "disk_hits": 0, "memory_hits": 1}
    c = _C._cpu_load("/* from a.py:1 */\n" + body + "/* trailing */\n", "fc_k")
    assert c["key"] != a["key"] and call(c) == 8


def test_cflags_split_and_passed(cache):
    _C._configure(make_cfg(cache, cflags="  -DFC_A=1\t-DFC_B=2  "))
    src = kernel(0).replace("return 0", "return FC_A + FC_B")
    assert call(_C._cpu_load(src, "fc_k")) == 3


@pytest.mark.parametrize("flag", ["-ffast-math", "-Ofast", "-funsafe-math-optimizations"])
def test_fast_math_cflags_refused(tmp_path, flag):
    with pytest.raises(ValueError, match="crtfastmath"):
        _C._configure(make_cfg(tmp_path / "cache", cflags="-O2 " + flag))


def test_mxcsr_unchanged_by_load(cache):
    before = _C._mxcsr()
    _C._cpu_load(kernel(2), "fc_k")
    assert _C._mxcsr() == before
    if before != -1:
        assert before & 0x8040 == 0  # neither FTZ nor DAZ


# ---------------------------------------------------------------------------
# corrupt entries: warn and recompile
# ---------------------------------------------------------------------------


def _populate(tmp_path, ret):
    """Compile in another process, so this one has never mapped the file."""
    cfg = make_cfg(tmp_path / "cache")
    src = kernel(ret)
    r = child(tmp_path, cfg, src)
    assert r["err"] is None
    _C._configure(cfg)
    return src, r["res"]


def _load_expect_corrupt(src, res, why):
    before = _C.stats()
    with pytest.warns(RuntimeWarning, match=r"cache entry .*%s.* is corrupt \(.*%s" % (re.escape(res["key"]), why)):
        r = _C._cpu_load(src, "fc_k")
    assert stats_delta(before)["compiles"] == 1
    assert r["so_path"] == res["so_path"]
    meta = open(r["so_path"][:-3] + ".meta").read()
    assert hashlib.sha256(open(r["so_path"], "rb").read()).hexdigest() in meta
    return r


def test_truncated_so_recompiled(tmp_path):
    src, res = _populate(tmp_path, 11)
    with open(res["so_path"], "r+b") as f:
        f.truncate(100)
    r = _load_expect_corrupt(src, res, "checksum mismatch")
    assert call(r) == 11
    assert os.path.getsize(r["so_path"]) > 100


def test_bitflipped_so_recompiled(tmp_path):
    src, res = _populate(tmp_path, 12)
    data = bytearray(open(res["so_path"], "rb").read())
    data[len(data) // 2] ^= 0xFF
    open(res["so_path"], "wb").write(bytes(data))
    assert call(_load_expect_corrupt(src, res, "checksum mismatch")) == 12


def test_corrupt_meta_recompiled(tmp_path):
    src, res = _populate(tmp_path, 13)
    open(res["so_path"][:-3] + ".meta", "w").write("garbage\n")
    assert call(_load_expect_corrupt(src, res, "does not match")) == 13


def test_missing_meta_recompiled(tmp_path):
    src, res = _populate(tmp_path, 14)
    os.unlink(res["so_path"][:-3] + ".meta")
    assert call(_load_expect_corrupt(src, res, "missing .meta")) == 14


def test_so_that_does_not_load_recompiled(tmp_path):
    """A .so whose checksum matches but that dlopen rejects."""
    src, res = _populate(tmp_path, 15)
    junk = b"not an ELF file at all"
    open(res["so_path"], "wb").write(junk)
    meta_path = res["so_path"][:-3] + ".meta"
    meta = open(meta_path).read()
    meta = re.sub(r"so_sha256 [0-9a-f]+", "so_sha256 " + hashlib.sha256(junk).hexdigest(), meta)
    open(meta_path, "w").write(meta)
    assert call(_load_expect_corrupt(src, res, "dlopen")) == 15


SAME_PROCESS = (
    NO_TORCH
    + r"""
import ctypes, os, sys, warnings
sys.path.insert(0, sys.argv[1])
from fastcompile import _C
fn = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)
def inode(addr):
    for line in open("/proc/self/maps"):
        f = line.split(); lo, hi = (int(x, 16) for x in f[0].split("-"))
        if lo <= addr < hi:
            return int(f[4])
_C._configure({"cc": sys.argv[2], "include_dir": sys.argv[3], "cache_dir": sys.argv[4],
               "version": "t"})
src = ('#include "fc_launch.h"\n'
       '__attribute__((visibility("default"))) int fc_k(const void *L) { return 77; }\n')
r1 = _C._cpu_load(src, "fc_k")
assert fn(r1["fn"])(None) == 77
with open(r1["so_path"], "r+b") as f:   # corrupt the file this process has mapped, in place
    f.truncate(100)
_C.cache_clear(disk=False)
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    r2 = _C._cpu_load(src, "fc_k")
assert len(w) == 1 and "corrupt" in str(w[0].message), [str(x.message) for x in w]
assert fn(r2["fn"])(None) == 77   # would SIGBUS if the stale mapping came back
assert inode(r2["fn"]) == os.stat(r2["so_path"]).st_ino
print("ok")
"""
)


def test_corrupted_in_place_while_mapped(tmp_path):
    """The process that has the .so mapped finds it truncated: the recompiled
    file must be mapped afresh (dlopen by the same name returns the old one)."""
    out = subprocess.run(
        [sys.executable, "-c", SAME_PROCESS, PKG_ROOT, CC, INCLUDE, str(tmp_path / "cache")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, (out.returncode, out.stderr)
    assert out.stdout.strip() == "ok"


def test_corrupt_warning_can_be_an_error(tmp_path):
    src, res = _populate(tmp_path, 16)
    os.unlink(res["so_path"][:-3] + ".meta")
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        with pytest.raises(RuntimeWarning):
            _C._cpu_load(src, "fc_k")
    # the fresh entry was still published and is now a clean disk hit elsewhere
    r = child(tmp_path, make_cfg(tmp_path / "cache"), src)
    assert r["warnings"] == [] and r["stats"]["disk_hits"] == 1


# ---------------------------------------------------------------------------
# compile failures
# ---------------------------------------------------------------------------


def test_compile_error_reports_command_log_and_numbered_source(cache):
    src = kernel(1).replace("return 1;", "return undefined_name_xyz;")
    before = _C.stats()
    with pytest.raises(RuntimeError) as ei:
        _C._cpu_load(src, "fc_k")
    msg = str(ei.value)
    assert stats_delta(before)["compiles"] == 1
    assert "command: " + CC in msg
    for flag in (
        "-O2",
        "-march=native",
        "-fPIC",
        "-shared",
        "-fopenmp",
        "-fno-math-errno",
        "-fno-trapping-math",
        "-ffp-contract=off",
        "-fwrapv",
        "-fvisibility=hidden",
        "-nostartfiles",
        "-I" + INCLUDE,
        "-lmvec",
        "-lm",
    ):
        assert flag in msg.split(), flag
    assert "-ffast-math" not in msg and "-Ofast" not in msg
    assert "--- compiler output ---" in msg and "undefined_name_xyz" in msg and "error" in msg
    assert "    6 |     return undefined_name_xyz;" in msg
    assert "    1 | #include \"fc_launch.h\"" in msg and "    2 | /* test kernel" in msg
    # nothing left behind: no temps, nothing published
    shard = [d for d in os.listdir(cache) if len(d) == 2]
    assert all(os.listdir(cache / d) == [] for d in shard)
    # and it is not cached as a failure: the next call compiles again
    with pytest.raises(RuntimeError):
        _C._cpu_load(src, "fc_k")
    assert stats_delta(before)["compiles"] == 2


def test_missing_symbol(cache):
    src = kernel(1).replace('__attribute__((visibility("default"))) ', "")
    before = _C.stats()
    with pytest.raises(RuntimeError, match="no exported symbol 'fc_k'"):
        _C._cpu_load(src, "fc_k")
    # the (good) .so stays cached; asking again is a disk read, not "corruption"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(RuntimeError, match="no exported symbol 'fc_k'"):
            _C._cpu_load(src, "fc_k")
    assert stats_delta(before)["compiles"] == 1


def test_two_symbols_from_one_source(cache):
    src = kernel(70) + ('__attribute__((visibility("default"))) int fc_k2(const void *L) { return 71; }\n')
    before = _C.stats()
    a = _C._cpu_load(src, "fc_k")
    b = _C._cpu_load(src, "fc_k2")
    assert a["key"] == b["key"] and a["so_path"] == b["so_path"]
    assert call(a) == 70 and call(b) == 71
    assert stats_delta(before) == {"compiles": 1, "disk_hits": 1, "memory_hits": 0}


def test_compiler_not_found(tmp_path):
    _C._configure(make_cfg(tmp_path / "cache", cc=str(tmp_path / "no-such-cc")))
    with pytest.raises(RuntimeError, match="not found"):
        _C._cpu_load(kernel(), "fc_k")


def test_compile_timeout_kills_the_compiler(tmp_path):
    pidfile = tmp_path / "child.pid"
    cc = fake_cc(
        tmp_path,
        f"""\
if [ "$1" = "--version" ]; then echo "slowcc 1.0"; exit 0; fi
sleep 60 &
echo $! > {pidfile}
wait
""",
    )
    _C._configure(make_cfg(tmp_path / "cache", cc=cc, compile_timeout=1))
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="timed out after 1 s"):
        _C._cpu_load(kernel(), "fc_k")
    assert time.monotonic() - t0 < 20
    pid = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:  # the grandchild died with its group
        try:
            state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            break
        if state == "Z":
            break
        time.sleep(0.05)
    else:
        pytest.fail("the compiler's child process survived the timeout")


def test_compiler_environment_is_scrubbed(tmp_path, monkeypatch):
    envlog = tmp_path / "env.txt"
    cc = fake_cc(tmp_path, f'env > {envlog}\nexec {CC} "$@"\n')
    monkeypatch.setenv("CFLAGS", "-DPOISON")
    monkeypatch.setenv("GCC_EXEC_PREFIX", "/nonexistent/")
    monkeypatch.setenv("FC_TEST_MARKER", "1")
    monkeypatch.setenv("LANG", "C.UTF-8")
    _C._configure(make_cfg(tmp_path / "cache", cc=cc))
    assert call(_C._cpu_load(kernel(4), "fc_k")) == 4
    names = {line.split("=", 1)[0] for line in envlog.read_text().splitlines() if "=" in line}
    assert {"PATH", "LANG"} <= names
    assert not names & {"CFLAGS", "GCC_EXEC_PREFIX", "FC_TEST_MARKER", "LD_PRELOAD"}


# ---------------------------------------------------------------------------
# cache folder safety
# ---------------------------------------------------------------------------


def _expect_refused(cfg_dir, why):
    _C._configure(make_cfg(cfg_dir))
    with pytest.warns(RuntimeWarning, match=r"refusing cache dir .*\(.*%s" % why):
        r = _C._cpu_load(kernel(), "fc_k")
    used = _C.stats()["cache_dir"]
    assert used.startswith("/tmp/fastcompile-") and used != str(cfg_dir)
    assert stat.S_IMODE(os.lstat(used).st_mode) == 0o700
    assert r["so_path"].startswith(used + "/")
    return used


def test_symlinked_cache_dir_refused(tmp_path):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(real)
    _expect_refused(link, "symlink")
    assert os.listdir(real) == []


def test_world_writable_cache_dir_refused(tmp_path):
    d = tmp_path / "open"
    d.mkdir()
    d.chmod(0o777)
    _expect_refused(d, "world-writable")
    assert os.listdir(d) == []


def test_group_writable_cache_dir_refused(tmp_path):
    d = tmp_path / "group"
    d.mkdir()
    d.chmod(0o770)
    _expect_refused(d, "group- or world-writable")


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to chown")
def test_foreign_owned_cache_dir_refused(tmp_path):
    d = tmp_path / "theirs"
    d.mkdir(mode=0o700)
    os.chown(d, 12345, 12345)
    _expect_refused(d, "owned by uid 12345")


def test_relative_cache_dir_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _expect_refused("rel/cache", "not an absolute path")
    assert not (tmp_path / "rel").exists()


def test_parent_writable_without_sticky_refused(tmp_path):
    parent = tmp_path / "shared"
    parent.mkdir()
    parent.chmod(0o777)
    _expect_refused(parent / "mine", "writable by others without the sticky bit")
    parent.chmod(0o1777)  # like /tmp: fine with a private leaf
    _C._configure(make_cfg(parent / "mine2"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        r = _C._cpu_load(kernel(), "fc_k")
    assert r["so_path"].startswith(str(parent / "mine2") + "/")


def test_cache_dir_created_private_with_parents(tmp_path):
    d = tmp_path / "a" / "b" / "cache"
    _C._configure(make_cfg(d))
    _C._cpu_load(kernel(), "fc_k")
    assert stat.S_IMODE(os.stat(d).st_mode) == 0o700
    assert _C.stats()["cache_dir"] == str(d)


def test_cache_dir_rechecked_before_use(tmp_path):
    d = tmp_path / "cache"
    _C._configure(make_cfg(d))
    _C._cpu_load(kernel(), "fc_k")
    d.chmod(0o777)  # someone loosened it after we chose it
    with pytest.warns(RuntimeWarning, match="world-writable"):
        _C._cpu_load(kernel(), "fc_k")
    assert _C.stats()["cache_dir"].startswith("/tmp/fastcompile-")


def test_fallback_dir_removed_on_reconfigure(tmp_path):
    d = tmp_path / "open"
    d.mkdir()
    d.chmod(0o777)
    used = _expect_refused(d, "world-writable")
    assert os.path.isdir(used)
    _C._configure(make_cfg(tmp_path / "fine"))
    assert not os.path.exists(used)


# ---------------------------------------------------------------------------
# concurrency
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("nproc", [4, 8])
def test_processes_racing_on_one_key(tmp_path, nproc):
    cfg = make_cfg(tmp_path / "cache")
    src = kernel(21)
    start = tmp_path / "go"
    procs = [child(tmp_path, cfg, src, start_file=str(start), wait=False) for _ in range(nproc)]
    wait_ready(str(start), procs)  # all imported and waiting at the line
    start.write_text("go")
    reports = [finish(p) for p in procs]
    assert all(r["err"] is None and r["ret"] == 21 for r in reports), reports
    assert all(r["warnings"] == [] for r in reports), reports
    paths = {r["res"]["so_path"] for r in reports}
    assert len(paths) == 1
    so = paths.pop()
    key = reports[0]["res"]["key"]
    published = sorted(key + x for x in (".so", ".c", ".meta"))
    assert sorted(os.listdir(os.path.dirname(so))) == published
    meta = open(so[:-3] + ".meta").read()
    assert hashlib.sha256(open(so, "rb").read()).hexdigest() in meta
    assert sum(r["stats"]["compiles"] + r["stats"]["disk_hits"] for r in reports) == nproc


def test_processes_racing_to_heal_a_corrupt_entry(tmp_path):
    cfg = make_cfg(tmp_path / "cache")
    src = kernel(23)
    so = child(tmp_path, cfg, src)["res"]["so_path"]
    with open(so, "r+b") as f:
        f.truncate(64)
    start = tmp_path / "go"
    procs = [child(tmp_path, cfg, src, start_file=str(start), wait=False) for _ in range(6)]
    wait_ready(str(start), procs)
    start.write_text("go")
    reports = [finish(p) for p in procs]
    assert all(r["err"] is None and r["ret"] == 23 for r in reports), reports
    assert all(len(r["warnings"]) <= 1 for r in reports)
    assert any("corrupt" in w for r in reports for w in r["warnings"])
    meta = open(so[:-3] + ".meta").read()
    assert hashlib.sha256(open(so, "rb").read()).hexdigest() in meta
    after = child(tmp_path, cfg, src)  # healed: a clean disk hit
    assert after["warnings"] == [] and after["stats"]["disk_hits"] == 1


def test_threads_racing_on_one_key(cache):
    src = kernel(22)
    results, errors = [], []
    barrier = threading.Barrier(4)

    def worker():
        try:
            barrier.wait()
            results.append(_C._cpu_load(src, "fc_k"))
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    before = _C.stats()
    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len({r["so_path"] for r in results}) == 1
    assert len({r["fn"] for r in results}) == 1
    assert all(call(r) == 22 for r in results)
    d = stats_delta(before)
    assert d["compiles"] + d["disk_hits"] + d["memory_hits"] == 4 and d["compiles"] >= 1
    # a fifth load is a plain memory hit
    _C._cpu_load(src, "fc_k")
    assert stats_delta(before)["memory_hits"] == d["memory_hits"] + 1


def test_different_keys_in_parallel_threads(cache):
    srcs = [kernel(30 + i) for i in range(4)]
    out = [None] * 4

    def worker(i):
        out[i] = _C._cpu_load(srcs[i], "fc_k")

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [call(r) for r in out] == [30, 31, 32, 33]
    assert len({r["key"] for r in out}) == 4


# ---------------------------------------------------------------------------
# cache_clear, stats, dump_dir, debug log
# ---------------------------------------------------------------------------

# ---------------------------------------------------------------------------
# precompiled header
# ---------------------------------------------------------------------------


def pch_kernel(ret):
    """A kernel that includes fc_kernel.h, as generated ones do (the header the .gch is of)."""
    return kernel(ret, include="fc_kernel.h")


def logging_cc(tmp_path):
    """(cc, calls()): the real compiler behind a script that logs each argv."""
    log = tmp_path / "cc.log"
    cc = fake_cc(tmp_path, f'echo "$@" >> {log}\nexec {CC} "$@"\n')
    return cc, lambda: log.read_text().splitlines() if log.exists() else []


def gch_of(cache):
    found = list(cache.glob("pch-*/fc_kernel.h.gch"))
    assert len(found) <= 1, found
    return found[0] if found else None


IS_CLANG = CC is not None and "clang" in subprocess.run([CC, "--version"], capture_output=True, text=True).stdout


@pytest.mark.skipif(IS_CLANG, reason="the precompiled header is GCC's")
def test_pch_built_once_then_used_by_every_kernel(tmp_path):
    cache = tmp_path / "cache"
    cc, calls = logging_cc(tmp_path)
    cfg = make_cfg(cache, cc=cc, pch=True)
    a = child(tmp_path, cfg, pch_kernel(21))
    assert a["err"] is None and a["ret"] == 21 and a["warnings"] == []
    assert a["stats"]["compiles"] == 1  # the header build is not a kernel compile
    gch = gch_of(cache)
    assert gch is not None and re.fullmatch(r"pch-[0-9a-f]{16}", gch.parent.name)
    assert stat.S_IMODE(os.stat(gch).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(gch.parent).st_mode) == 0o700
    first = calls()
    assert first[0] == "--version" and len(first) == 3
    header = [c for c in first if "-x c-header" in c]
    assert len(header) == 1 and header[0].endswith(os.path.join(INCLUDE, "fc_kernel.h"))
    # a kernel compile puts the header's folder before the shipped headers
    kern = [c.split() for c in first if "-x c-header" not in c and c != "--version"][0]
    assert kern.index("-I" + str(gch.parent)) < kern.index("-I" + INCLUDE)
    # the next process finds it: one compiler run per kernel, no header build
    b = child(tmp_path, cfg, pch_kernel(22))
    assert b["err"] is None and b["ret"] == 22 and b["warnings"] == []
    assert len(calls()) == 4 and "-x c-header" not in calls()[3]
    # GCC really reads it: an unreadable one fails the kernel's first compile
    # (a file GCC skipped would not), which is then made without it
    with open(gch, "r+b") as f:
        f.truncate(os.path.getsize(gch) // 2)
    c = child(tmp_path, cfg, pch_kernel(23))
    assert c["err"] is None and c["ret"] == 23 and c["stats"]["compiles"] == 1
    assert len(c["warnings"]) == 1 and "precompiled header" in c["warnings"][0]
    assert str(gch) in c["warnings"][0] and not gch.exists()
    retry = calls()[4:]
    assert len(retry) == 2 and "-I" + str(gch.parent) in retry[0].split()
    assert "-I" + str(gch.parent) not in retry[1].split()
    # the next batch that compiles builds it again
    d = child(tmp_path, cfg, pch_kernel(24))
    assert d["err"] is None and d["ret"] == 24 and d["warnings"] == [] and gch.exists()


def test_pch_not_built_for_disk_hits(tmp_path):
    cache = tmp_path / "cache"
    cc, calls = logging_cc(tmp_path)
    cfg = make_cfg(cache, cc=cc, pch=True)
    src = pch_kernel(31)
    assert child(tmp_path, cfg, src)["ret"] == 31
    gch = gch_of(cache)
    if gch is not None:
        gch.unlink()
    n = len(calls())
    r = child(tmp_path, cfg, src)  # a warm start: nothing to compile, so nothing to build
    assert r["ret"] == 31 and r["stats"] == r["stats"] | {"compiles": 0, "disk_hits": 1}
    assert len(calls()) == n and gch_of(cache) is None


def test_pch_build_failure_is_harmless_and_not_retried(tmp_path):
    log = tmp_path / "cc.log"
    cc = fake_cc(
        tmp_path,
        f"""\
echo "$@" >> {log}
case "$*" in *"-x c-header"*) exit 1;; esac
exec {CC} "$@"
""",
    )
    _C._configure(make_cfg(tmp_path / "cache", cc=cc, pch=True))
    assert call(_C._cpu_load(pch_kernel(41), "fc_k")) == 41
    assert call(_C._cpu_load(pch_kernel(42), "fc_k")) == 42
    runs = log.read_text().splitlines()
    assert sum("-x c-header" in c for c in runs) == 1  # failed once: not tried again
    assert gch_of(tmp_path / "cache") is None
    assert not list((tmp_path / "cache").glob("pch-*/*.tmp"))


def test_pch_never_given_to_clang(tmp_path):
    log = tmp_path / "cc.log"
    cc = fake_cc(
        tmp_path,
        f"""\
if [ "$1" = "--version" ]; then echo "clang version 17.0.0"; exit 0; fi
echo "$@" >> {log}
exec {CC} "$@"
""",
    )
    _C._configure(make_cfg(tmp_path / "cache", cc=cc, pch=True))
    assert call(_C._cpu_load(pch_kernel(51), "fc_k")) == 51
    runs = log.read_text().splitlines()
    assert len(runs) == 1 and "pch-" not in runs[0]
    assert not list((tmp_path / "cache").glob("pch-*"))


def test_pch_off(tmp_path):
    cc, calls = logging_cc(tmp_path)
    _C._configure(make_cfg(tmp_path / "cache", cc=cc, pch=False))
    assert call(_C._cpu_load(pch_kernel(61), "fc_k")) == 61
    assert len(calls()) == 2 and not any("pch-" in c for c in calls())


def test_cache_clear_memory_only(cache):
    src = kernel(40)
    r1 = _C._cpu_load(src, "fc_k")
    _C.cache_clear(disk=False)
    before = _C.stats()
    r2 = _C._cpu_load(src, "fc_k")
    assert stats_delta(before) == {"compiles": 0, "disk_hits": 1, "memory_hits": 0}
    assert call(r1) == 40 and call(r2) == 40  # r1's kernel is still mapped
    assert r2["so_path"] == r1["so_path"]


def test_cache_clear_disk(tmp_path):
    cache = tmp_path / "cache"
    _C._configure(make_cfg(cache, pch=True))
    src = pch_kernel(41)
    r1 = _C._cpu_load(src, "fc_k")
    assert IS_CLANG or gch_of(cache) is not None
    shard = cache / r1["key"][:2]
    foreign = [cache / "notes.txt", shard / "mine.txt"]
    for f in foreign:
        f.write_text("keep me")
    counters = _C.stats()
    _C.cache_clear(disk=True)
    assert {k: _C.stats()[k] for k in counters} == counters  # counters are not reset
    assert not os.path.exists(r1["so_path"]) and not os.path.exists(r1["c_path"])
    assert not any(p.name.startswith("compiler-") for p in cache.iterdir())
    assert not list(cache.glob("pch-*"))
    assert all(f.read_text() == "keep me" for f in foreign)
    before = _C.stats()
    r2 = _C._cpu_load(src, "fc_k")
    assert stats_delta(before)["compiles"] == 1
    assert os.path.exists(r2["so_path"]) and call(r2) == 41
    assert call(r1) == 41  # the old mapping survives the unlink
    # the new file is what got mapped, not the old one that had the same name
    assert mapped_inode(r2["fn"]) == os.stat(r2["so_path"]).st_ino != mapped_inode(r1["fn"])


def test_stats_shape(cache):
    s = _C.stats()
    assert {"compiles", "disk_hits", "memory_hits", "cache_dir"} <= set(s)  # + allocator's
    assert all(isinstance(s[k], int) for k in ("compiles", "disk_hits", "memory_hits"))


def test_dump_dir(tmp_path):
    dump = tmp_path / "dump" / "nested"
    _C._configure(make_cfg(tmp_path / "cache", dump_dir=str(dump)))
    src = kernel(50)
    r = _C._cpu_load(src, "fc_k")
    assert (dump / (r["key"] + ".c")).read_text() == src


def test_debug_log(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="fastcompile")
    _C._configure(make_cfg(tmp_path / "cache", debug=1))
    src = kernel(60)
    r = _C._cpu_load(src, "fc_k")
    assert "compiled in" in caplog.text and r["so_path"] in caplog.text
    caplog.clear()
    _C._configure(make_cfg(tmp_path / "cache", debug=0))
    _C.cache_clear(disk=False)
    _C._cpu_load(src, "fc_k")
    assert caplog.text == ""


def test_configure_validates(tmp_path):
    with pytest.raises(TypeError):
        _C._configure(make_cfg(tmp_path, cc=12))
    with pytest.raises(ValueError):
        _C._configure(make_cfg(tmp_path, compile_timeout=0))
    for _ in range(50):  # repeated reconfiguration frees the old strings (ASan build)
        _C._configure(make_cfg(tmp_path / "cache", cflags="-DX=1 -DY=2", dump_dir=None))


# ---------------------------------------------------------------------------
# bundles: a batch with more kernels to compile than CPUs, several to a run
# ---------------------------------------------------------------------------

WORKERS = min(max(os.sysconf("SC_NPROCESSORS_ONLN"), 1), 16)  # pool.c's fc_pool_width


def named_kernel(name, ret, tag=None, body=""):
    """A kernel shaped as the renderer makes them: a comment, then #include "fc_kernel.h", a
    static helper named after the kernel, and the exported entry point `name`. The tag (unique
    unless given) goes after the #include: the key leaves out the leading comment."""
    return (
        f"/* a test kernel */\n#include \"fc_kernel.h\"\n/* {tag or uuid.uuid4().hex} */\n\n"
        f"static int\n{name}_value(void)\n{{\n    return {ret};\n}}\n\n"
        f"FC_EXPORT int\n{name}(const fc_launch *L)\n{{\n    (void)L;\n{body}"
        f"    return {name}_value();\n}}\n"
    )


def batch(n, tag=None, first=0):
    tag = tag or uuid.uuid4().hex
    return [(named_kernel("fc_b%d" % i, 100 + i, tag=tag), "fc_b%d" % i) for i in range(first, first + n)]


def test_bundles_compile_a_batch_in_one_compiler_run_per_cpu(cache):
    """More kernels than CPUs: one compiler run per CPU, each making one .so that every kernel in
    it publishes under its own key (hard links to one file, mapped once); each key keeps its own
    .c; no temporary is left; and a process that lost its memory cache finds every kernel on
    disk."""
    n = WORKERS + 3
    jobs = batch(n)
    before = _C.stats()
    res = _C._cpu_load_many(jobs)
    d = stats_delta(before)
    assert d["compiles"] == n and runs_delta(before) == WORKERS and d["disk_hits"] == 0
    assert [call(r) for r in res] == [100 + i for i in range(n)]
    inodes = [os.stat(r["so_path"]).st_ino for r in res]
    assert len(set(inodes)) == WORKERS and len({r["key"] for r in res}) == n
    for (src, sym), r, ino in zip(jobs, res, inodes):
        assert os.stat(r["so_path"]).st_nlink == inodes.count(ino)
        assert mapped_inode(r["fn"]) == ino
        assert open(r["c_path"]).read() == src
    assert not [f.name for f in cache.rglob("*") if ".bundle." in f.name or ".tmp" in f.name]
    _C.cache_clear(disk=False)
    before = _C.stats()
    again = _C._cpu_load_many(jobs)
    assert stats_delta(before) == {"compiles": 0, "disk_hits": n, "memory_hits": 0}
    assert runs_delta(before) == 0
    assert [call(r) for r in again] == [100 + i for i in range(n)]


def test_bundles_off_one_compiler_run_per_kernel(tmp_path):
    _C._configure(make_cfg(tmp_path / "cache", compile_bundles=False))
    n = WORKERS + 2
    before = _C.stats()
    res = _C._cpu_load_many(batch(n))
    assert stats_delta(before)["compiles"] == n and runs_delta(before) == n
    assert len({os.stat(r["so_path"]).st_ino for r in res}) == n
    assert [call(r) for r in res] == [100 + i for i in range(n)]


def test_bundles_never_put_one_symbol_twice_in_a_run(cache):
    """Kernels that share a symbol would clash in one translation unit: each goes to another
    run. All fc_k (the tests' usual symbol): one run each. One more fc_b0 in a bundled batch:
    the two fc_b0 land in different files, and both return their own value."""
    n = WORKERS + 2
    same = [(kernel(10 + i, include="fc_kernel.h"), "fc_k") for i in range(n)]
    before = _C.stats()
    res = _C._cpu_load_many(same)
    assert runs_delta(before) == n
    assert [call(r) for r in res] == [10 + i for i in range(n)]
    jobs = batch(n) + [(named_kernel("fc_b0", 7), "fc_b0")]
    before = _C.stats()
    res = _C._cpu_load_many(jobs)
    assert stats_delta(before)["compiles"] == n + 1
    assert runs_delta(before) == max(WORKERS, 2)  # 1 CPU: it goes alone
    assert [call(r) for r in res] == [100 + i for i in range(n)] + [7]
    assert os.stat(res[0]["so_path"]).st_ino != os.stat(res[-1]["so_path"]).st_ino


@pytest.mark.parametrize(
    "odd",
    [
        "other_include",
        "define",
        "spaced_define",
        "pragma_op",
        "pragma_gcc",
        "comment_define",
        "digraph_define",
        "trigraph_define",
        "omp_threadprivate",
    ],
)
def test_bundles_take_only_rendered_kernels(cache, odd):
    """A source that starts with another #include, or whose directives reach past the kernel
    (a macro, which would leak into the kernels after it, however it is spelled; a GCC pragma)
    compiles alone; the rest still share runs."""
    n = WORKERS + 2
    bodies = {
        "define": "#define FC_TEST_ODD 1\n",
        "spaced_define": "  #  define FC_TEST_ODD 1\n",
        "pragma_op": "    _Pragma(\"GCC diagnostic ignored \\\"-Wall\\\"\")\n",
        "pragma_gcc": "#pragma GCC diagnostic ignored \"-Wall\"\n",
        "comment_define": "/**/ #define FC_TEST_ODD 1\n",
        "digraph_define": "%:define FC_TEST_ODD 1\n",
        "trigraph_define": "??=define FC_TEST_ODD 1\n",
        "omp_threadprivate": "    static int fc_tp = 0;\n#pragma omp threadprivate(fc_tp)\n    (void)fc_tp;\n",
    }
    if odd in bodies:
        src = named_kernel("fc_odd", 5, body=bodies[odd])
    else:
        src = "#include \"fc_launch.h\"\n" + named_kernel("fc_odd", 5).replace(
            "FC_EXPORT", "__attribute__((visibility(\"default\")))"
        )
    before = _C.stats()
    res = _C._cpu_load_many(batch(n) + [(src, "fc_odd")])
    assert runs_delta(before) == WORKERS + 1
    assert [call(r) for r in res] == [100 + i for i in range(n)] + [5]


def test_bundle_that_fails_compiles_each_kernel_alone(cache):
    """One kernel that does not compile fails its whole run; then each kernel of that run
    compiles alone: the error is the bad kernel's (its own source, not the bundle's), and every
    other kernel is loaded (a second batch finds them all in memory). 2 kernels per run: the
    bad one (the longest) leads one, and the last good one joins it."""
    n = 2 * WORKERS - 1
    good = batch(n)
    bad = (named_kernel("fc_bad", 0, body="    this is not C;\n"), "fc_bad")
    before = _C.stats()
    with pytest.raises(RuntimeError) as e:
        _C._cpu_load_many(good + [bad])
    msg = str(e.value)
    assert "'fc_bad'" in msg and "this is not C" in msg
    listing = msg.split("--- source ---", 1)[1]
    assert listing.count("FC_EXPORT") == 1 and "fc_b0" not in listing
    assert stats_delta(before)["compiles"] == n + 1 and runs_delta(before) == WORKERS + 2
    before = _C.stats()
    res = _C._cpu_load_many(good)
    assert stats_delta(before) == {"compiles": 0, "disk_hits": 0, "memory_hits": n}
    assert [call(r) for r in res] == [100 + i for i in range(n)]


@pytest.mark.skipif(IS_CLANG, reason="the precompiled header is GCC's")
def test_bundled_batch_builds_no_precompiled_header(tmp_path):
    """Each bundle parses the header once anyway: the batch does not hold a worker up building
    the .gch. The next batch that compiles kernels one per run builds it."""
    cache = tmp_path / "cache"
    cc, calls = logging_cc(tmp_path)
    _C._configure(make_cfg(cache, cc=cc, pch=True))
    res = _C._cpu_load_many(batch(WORKERS + 1))
    assert [call(r) for r in res] == [100 + i for i in range(WORKERS + 1)]
    assert gch_of(cache) is None and not any("-x c-header" in c for c in calls())
    assert call(_C._cpu_load(pch_kernel(77), "fc_k")) == 77
    gch = gch_of(cache)
    assert gch is not None
    # with the .gch there, bundles use it: only the first kernel of a bundle may #include the
    # header (a second #include would look for it in the .gch's folder and fail the run)
    n = len(calls())
    before = _C.stats()
    res = _C._cpu_load_many(batch(WORKERS + 1, first=50))
    assert [call(r) for r in res] == [150 + i for i in range(WORKERS + 1)]
    assert stats_delta(before)["compiles"] == WORKERS + 1 and runs_delta(before) == WORKERS
    runs = calls()[n:]
    assert len(runs) == WORKERS and all("-I" + str(gch.parent) in r.split() for r in runs)


LOAD_MANY_CHILD = (
    NO_TORCH
    + r"""
import json, sys, os, time, ctypes
sys.path.insert(0, sys.argv[1])
from fastcompile import _C
job = json.load(open(sys.argv[2]))
_C._configure(job["cfg"])
open(job["start_file"] + ".ready.%d" % os.getpid(), "w").close()
while not os.path.exists(job["start_file"]):
    time.sleep(0.001)
res = _C._cpu_load_many([tuple(j) for j in job["jobs"]])
rets = [ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)(r["fn"])(None) for r in res]
print(json.dumps({"rets": rets, "stats": _C.stats()}))
"""
)


def test_bundles_published_by_two_processes_at_once(tmp_path):
    """Two processes compile the same batch at the same moment: each kernel's key is published
    once (whoever links first), the other process loads that file after checking it, and both
    get every kernel right."""
    cache = tmp_path / "cache"
    cfg = make_cfg(cache)
    jobs = batch(WORKERS + 3)
    script = tmp_path / "many.py"
    script.write_text(LOAD_MANY_CHILD)
    start = str(tmp_path / "go")
    procs = []
    for i in range(2):
        job = tmp_path / f"job{i}.json"
        job.write_text(json.dumps({"cfg": cfg, "jobs": jobs, "start_file": start}))
        procs.append(
            subprocess.Popen(
                [sys.executable, str(script), PKG_ROOT, str(job)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    wait_ready(start, procs)
    open(start, "w").close()
    reports = [finish(p) for p in procs]
    for r in reports:
        assert r["rets"] == [100 + i for i in range(len(jobs))]
        assert r["stats"]["compiles"] + r["stats"]["disk_hits"] == len(jobs)
    assert len(list(cache.rglob("*.so"))) == len(jobs)
    assert not [f.name for f in cache.rglob("*") if ".bundle." in f.name or ".tmp" in f.name]


def test_bundle_leader_in_a_shard_not_ours_fails_alone(tmp_path):
    """The bundle's temporary files go in its leader's shard: when that shard is not a private
    folder of ours, nothing is written there and the leader fails with that error, even when its
    bundle then fails and the others compile alone (every kernel here defines the same static
    helper: fine alone, a redefinition in one translation unit)."""

    def clashing(name, ret, pad=""):
        return named_kernel(name, ret).replace(
            "#include \"fc_kernel.h\"\n",
            "#include \"fc_kernel.h\"\nstatic int fc_same(void) { return 1; }\n/* %s */\n" % pad,
        )

    lead = (clashing("fc_lead", 9, pad="x" * 16), "fc_lead")  # a little longer: it leads a bundle
    n = 2 * WORKERS - 1
    _C._configure(make_cfg(tmp_path / "probe"))  # the keys, and so the shards
    key = _C._cpu_load_many([lead])[0]["key"]
    others = []
    while len(others) < n:  # none of the others in the leader's shard
        i = len(others)
        job = (clashing("fc_c%d" % i, 100 + i), "fc_c%d" % i)
        if _C._cpu_load_many([job])[0]["key"][:2] != key[:2]:
            others.append(job)
    _C.cache_clear(disk=False)  # the memory table would find them
    cache = tmp_path / "cache"
    _C._configure(make_cfg(cache))
    _C._cpu_load_many(batch(1))  # makes the cache folder
    shard = cache / key[:2]
    shard.mkdir(exist_ok=True)
    shard.chmod(0o770)
    before_files = set(os.listdir(shard))
    with pytest.raises(RuntimeError, match="not a private directory"):
        _C._cpu_load_many([lead] + others)
    assert set(os.listdir(shard)) == before_files
    before = _C.stats()
    res = _C._cpu_load_many(others)
    assert stats_delta(before)["memory_hits"] == n
    assert [call(r) for r in res] == [100 + i for i in range(n)]


def test_module_state_shows_torch_objects_to_the_gc():
    """The torch objects the device-array code keeps (fc_state.dev) are the
    module's references in gc's view (m_traverse), once a tensor reached a graph."""
    torch = pytest.importorskip("torch")
    import gc
    from fastcompile.graph import Graph

    g = Graph()
    x = g.input("float32", 1)
    g.output(g.call("add", x, x))
    c = g.compile()
    with pytest.raises(TypeError):
        c(torch.ones(3))  # a CPU tensor: refused, after the bridge loaded
    assert torch.Tensor in gc.get_referents(_C)
