#!/bin/bash
# The device checks of a session lent a GPU, as one call (see tests/gpu and benchmarks/gpu.py):
#   bash tools/gpu_check.sh [OUTDIR]
# Imports fastcompile from python/ (a _C built here for this Python, else built now in place),
# then: the smoke test, benchmarks/gpu.py alone on the GPU, then tests/gpu/test_cuda_torch.py
# and test_cuda_matrix.py side by side, then benchmarks/gpu_tuning.py (launch settings). Each step
# has its own time limit; logs go to OUTDIR (7 files: the device tool brings back 8 at most).
# A full run took about 4 minutes on an H100, plus the machine's start.
set -u
OUT=${1:-${OUT:-/tmp/fc-gpu-check}}
mkdir -p "$OUT"
export PYTHONPATH=$PWD/python PYTHONUNBUFFERED=1
if ls .whl/*.whl > /dev/null 2>&1; then     # packages the machine lacks, carried as wheels (bytecode)
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/fc-site .whl/*.whl && \
        export PYTHONPATH=$PYTHONPATH:/tmp/fc-site
fi
T0=$(date +%s)
step() { echo "== $(( $(date +%s) - T0 ))s: $*"; }
step start
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv 2>&1 | tee "$OUT/info.txt"
if ! python3 -c "import fastcompile" 2>/dev/null; then
    step "building _C in place for $(python3 -V)"
    python3 setup.py build_ext --inplace -q > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
fi
python3 -c "import fastcompile, json; print(json.dumps(fastcompile.cuda_info(), indent=1))" 2>&1 | tee -a "$OUT/info.txt"
step smoke
timeout ${SMOKE_S:-90} python3 -m pytest -q -x -p no:cacheprovider tests/gpu/test_cuda_device.py 2>&1 | tail -30 | tee -a "$OUT/info.txt"
step benchmark
timeout ${BENCH_S:-170} python3 benchmarks/gpu.py ${BENCH_ARGS:---step 4} > "$OUT/bench.md" 2> "$OUT/bench.err"
tail -40 "$OUT/bench.md"; tail -5 "$OUT/bench.err"
step tests
timeout ${TEST_S:-200} python3 -m pytest -q -p no:cacheprovider -n 4 tests/gpu/test_cuda_torch.py tests/gpu/test_cuda_device.py > "$OUT/torch.log" 2>&1 &
timeout ${TEST_S:-200} python3 -m pytest -q -p no:cacheprovider -n 11 tests/gpu/test_cuda_matrix.py > "$OUT/matrix.log" 2>&1 &
wait
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/torch.log" | tail -40
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/matrix.log" | cut -c1-200 | tail -60
step tuning
timeout ${TUNE_S:-90} python3 benchmarks/gpu_tuning.py ${TUNE_ARGS:---reps 10} > "$OUT/tune.md" 2>&1
tail -5 "$OUT/tune.md"
step done
