#!/usr/bin/env bash
# One GPU session on the H200 (the `device` machine): floors, benchmark report, GPU test suite.
# Binaries are built on the development machine and carried in .device-bin/:
#   cargo build --release && cargo test --release -p fp4tune --features gpu --no-run
#   cp target/release/fp4tune <the gpu_gemm and fp4tune lib test executables> .device-bin/
# Every step has its own time limit so one slow step cannot take the others' results with it.
set -u
OUT=${OUT:-$PWD/h200-out}
mkdir -p "$OUT"
B=${B:-.device-bin}
export FP4TUNE_CACHE=${FP4TUNE_CACHE:-/tmp/fp4tune-cache}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > "$OUT/device.txt" 2>&1
step() { local t=$1; shift; echo "== $* (limit ${t}s)" >&2; timeout "$t" "$@"; echo "== exit $? after ${SECONDS}s" >&2; }
step 60 "$B/fp4tune" floors > "$OUT/floors.txt" 2>&1
step "${BENCH_LIMIT:-300}" "$B/fp4tune" bench --sets tp8,tp4,ep8 --only routed --m "${BENCH_M:-1,4,16,1024}" \
  --out "$OUT" > "$OUT/bench-log.txt" 2>&1
step "${SUITE_LIMIT:-200}" "$B/gpu_gemm" --test-threads 1 --nocapture > "$OUT/gpu-tests.txt" 2>&1
step 60 "$B/fp4tune_lib" --test-threads 1 gpu_ >> "$OUT/gpu-tests.txt" 2>&1
tail -n 5 "$OUT"/*.txt
