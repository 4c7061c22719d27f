#!/usr/bin/env bash
# One GPU session on the H200 (the `device` machine): the GPU correctness suite, the benchmark
# report, a model-guided tune of the GLM-5 TP8 routed shapes, the dispatch-table check, the runtime
# GPU tests and the Rust, Python and C examples. Binaries are built on the development machine and
# carried in .device-bin/ (the device has CUDA and a C compiler but no cargo):
#   cargo build --release && cargo build --release --example gemm
#   cargo test --release -p fp4tune --features gpu --no-run      # prints the test executables
#   cp target/release/{fp4tune,libfp4tune.so,examples/gemm} .device-bin/
#   cp <unittests src/lib.rs executable> .device-bin/fp4tune_lib
#   cp <tests/gpu_gemm.rs executable> .device-bin/gpu_gemm
# Every step has its own time limit so that one slow step cannot take the others' results with it.
# results/h200/session-3-log.txt is the log of the run behind results/ (the suite and the
# benchmark in one device call, the rest in a second one: SUITE=0 / BENCH=0 skip them).
# FP4TUNE_SUITE_ONLY=<text> restricts the suite to variants whose name contains it (e.g. _p).
set -u
OUT=${OUT:-$PWD/h200-out}
mkdir -p "$OUT"
B=${B:-.device-bin}
export FP4TUNE_CACHE=${FP4TUNE_CACHE:-/tmp/fp4tune-cache}
LOG="$OUT/logs.txt"
step() { local t=$1; shift; echo "== $* (limit ${t}s, at ${SECONDS}s)" >> "$LOG"; timeout "$t" "$@" >> "$LOG" 2>&1; echo "== exit $? at ${SECONDS}s" >> "$LOG"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv >> "$LOG" 2>&1
if [ "${SUITE:-1}" = 1 ]; then
  step "${SUITE_LIMIT:-300}" "$B/gpu_gemm" --test-threads 2 --nocapture
fi
if [ "${BENCH:-1}" = 1 ]; then
  step "${BENCH_LIMIT:-250}" "$B/fp4tune" bench --sets tp8,tp4,ep8 --only routed --m "${BENCH_M:-1,4,16,1024}" \
    --max-candidates "${BENCH_CANDIDATES:-150}" --out "$OUT"
fi
step "${TUNE_LIMIT:-200}" "$B/fp4tune" tune --only routed --max-m 1024 --strategy model --budget "${TUNE_BUDGET:-0.02}" --out "$OUT"
step 20 "$B/fp4tune" table --check "$OUT/nvidia-h200.ron" --device 0
step 40 "$B/fp4tune_lib" --test-threads 1 runtime::gpu_tests
step 20 "$B/gemm" "$OUT/nvidia-h200.ron" 4
step 40 python3 examples/python/glm5_expert.py --table "$OUT/nvidia-h200.ron" --lib "$B/libfp4tune.so"
step 40 sh -c "cc examples/c/gemm.c -I include -L $B -lfp4tune -l:libcuda.so.1 -Wl,-rpath,\$PWD/$B -o /tmp/gemm_c && /tmp/gemm_c $OUT/nvidia-h200.ron"
tail -n 80 "$LOG"
