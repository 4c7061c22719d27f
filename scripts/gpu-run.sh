#!/usr/bin/env bash
# Reproduces the GPU results in results/ on a machine with an NVIDIA GPU (see results/README.md
# for which file each step writes): the tune of the GLM-5 TP8 routed shapes (fused kernels, then
# the dequantize-then-cuBLAS method on M >= 128), the dispatch-table check, the runtime and
# composite GPU tests, the Rust/Python/C examples and the W4A16 benchmark; then (SUITE=1) the
# whole GPU correctness suite, one activation type per step (a cold cubin cache needs minutes of
# NVRTC per type); then (EXTRA=1) the EP tune and the W4A4 and prefill benchmarks.
#
# Binaries come prebuilt in $B (default .device-bin/), so the GPU machine needs CUDA and a C
# compiler but no cargo:
#   cargo build --release && cargo build --release --example gemm
#   cargo test --release -p fp4tune --features gpu --no-run      # prints the test executables
#   cp target/release/{fp4tune,libfp4tune.so,examples/gemm} .device-bin/
#   cp <unittests src/lib.rs executable> .device-bin/fp4tune_lib
#   cp <tests/gpu_gemm.rs executable> .device-bin/gpu_gemm
# Every step has its own time limit so that one slow step cannot take the others' results with
# it; SUITE=0 / EXTRA=0 skip those parts (e.g. to fit a per-call limit). Writes into $OUT; the
# whole output of every step goes to $OUT/logs.txt.
set -u
OUT=${OUT:-$PWD/gpu-out}; mkdir -p "$OUT"
export FP4TUNE_CACHE=${FP4TUNE_CACHE:-/tmp/fp4tune-cache}
B=${B:-.device-bin}; LOG=$OUT/logs.txt
step() { local t=$1; shift; echo "== $* (limit ${t}s, at ${SECONDS}s)" >> "$LOG"; timeout "$t" "$@" >> "$LOG" 2>&1; echo "== exit $? at ${SECONDS}s" >> "$LOG"; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv >> "$LOG" 2>&1
step 200 "$B/fp4tune" tune --only routed --max-m 1024 --strategy model --budget 0.02 --out "$OUT"
TABLE=$(ls "$OUT"/*.ron 2>/dev/null | head -n 1)
step 20 "$B/fp4tune" table --check "$TABLE" --device 0
step 60 "$B/fp4tune_lib" --test-threads 1 gpu_tests
step 20 "$B/gemm" "$TABLE" 4
step 40 python3 examples/python/glm5_expert.py --table "$TABLE" --lib "$B/libfp4tune.so"
step 30 sh -c "cc examples/c/gemm.c -I include -L $B -lfp4tune -l:libcuda.so.1 -Wl,-rpath,\$PWD/$B -o /tmp/gemm_c && /tmp/gemm_c $TABLE"
mkdir -p "$OUT/bench"
step 190 "$B/fp4tune" bench --set tp8,tp4,ep8 --only routed --m 1,4,16,1024 --max-candidates 150 --out "$OUT/bench"
if [ "${SUITE:-1}" = 1 ]; then
  step 580 "$B/gpu_gemm" --test-threads 1 --nocapture every_variant_matches_the_cpu_reference_w4a16
  step 580 "$B/gpu_gemm" --test-threads 1 --nocapture every_variant_matches_the_cpu_reference_w4a4
fi
if [ "${EXTRA:-1}" = 1 ]; then
  mkdir -p "$OUT/ep8" "$OUT/w4a4" "$OUT/prefill"
  step 200 "$B/fp4tune" tune --set ep8 --only routed --max-m 1024 --strategy model --budget 0.02 --out "$OUT/ep8"
  step 150 "$B/fp4tune" bench --set tp8,tp4,ep8 --only routed --a-type w4a4 --m 1,16 --max-candidates 100 --out "$OUT/w4a4"
  step 150 "$B/fp4tune" bench --set tp8,tp4,ep8 --only routed --m 256,1024 --max-candidates 60 --out "$OUT/prefill"
fi
grep -v "running for over" "$LOG" | tail -60
