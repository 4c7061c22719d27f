#!/usr/bin/env bash
# One GPU session on the H200 (the `device` machine): benchmark report, a model-guided tune of the
# GLM-5 TP8 routed shapes, the dispatch-table check, the runtime GPU tests and the examples.
# Binaries are built on the development machine and carried in .device-bin/:
#   cargo build --release && cargo build --release --example gemm
#   cargo test --release -p fp4tune --features gpu --no-run
#   cp target/release/{fp4tune,libfp4tune.so,examples/gemm} <test executables> .device-bin/
# Every step has its own time limit so that one slow step cannot take the others' results with it.
set -u
OUT=${OUT:-$PWD/h200-out}
mkdir -p "$OUT"
B=${B:-.device-bin}
export FP4TUNE_CACHE=${FP4TUNE_CACHE:-/tmp/fp4tune-cache}
LOG="$OUT/logs.txt"
step() { local t=$1; shift; echo "== $* (limit ${t}s, at ${SECONDS}s)" >> "$LOG"; timeout "$t" "$@" >> "$LOG" 2>&1; echo "== exit $? at ${SECONDS}s" >> "$LOG"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv >> "$LOG" 2>&1
step "${BENCH_LIMIT:-150}" "$B/fp4tune" bench --sets tp8,tp4,ep8 --only routed --m "${BENCH_M:-1,2,4,8,16,1024}" \
  --max-candidates "${BENCH_CANDIDATES:-100}" --out "$OUT"
step "${TUNE_LIMIT:-130}" "$B/fp4tune" tune --only routed --max-m 1024 --strategy model --budget "${TUNE_BUDGET:-0.03}" --out "$OUT"
step 20 "$B/fp4tune" table --check "$OUT/nvidia-h200.ron" --device 0
step 40 "$B/fp4tune_lib" --test-threads 1 runtime::gpu_tests
step 20 "$B/gemm" "$OUT/nvidia-h200.ron" 4
step 40 python3 examples/python/glm5_expert.py --table "$OUT/nvidia-h200.ron" --lib "$B/libfp4tune.so"
tail -n 60 "$LOG"
