#!/usr/bin/env bash
# The device calls behind results/nvidia-h200.ron and results/h200/bench-*.md (session 5,
# results/h200/session-5-log.txt): tune first (fused kernels, then the dequantize-then-cuBLAS
# method on M >= 128), then the table check, the runtime and composite GPU tests, the Rust/Python/C
# examples and the W4A16 benchmark; then (SUITE=1) the whole GPU suite, one
# activation type per step because a cold cubin cache needs ~160 s (W4A16) and ~290 s (W4A4) of
# NVRTC on 16 cores; then (EXTRA=1) the W4A4 and prefill benchmarks. Session 5 ran it as four
# device calls (SUITE=0 EXTRA=0, the two suite steps, then EXTRA) so that no call came near the
# 600 s limit. Binaries as in the header of scripts/h200-run.sh; writes into $OUT.
set -u
OUT=${OUT:-$PWD/h200-out}; mkdir -p "$OUT"
export FP4TUNE_CACHE=${FP4TUNE_CACHE:-/tmp/fp4c}; B=${B:-.device-bin}; LOG=$OUT/logs.txt
step() { local t=$1; shift; echo "== $* (limit ${t}s, at ${SECONDS}s)" >> "$LOG"; timeout "$t" "$@" >> "$LOG" 2>&1; echo "== exit $? at ${SECONDS}s" >> "$LOG"; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv >> $LOG 2>&1
step 200 $B/fp4tune tune --only routed --max-m 1024 --strategy model --budget 0.02 --out $OUT
step 20 $B/fp4tune table --check $OUT/nvidia-h200.ron --device 0
step 60 $B/fp4tune_lib --test-threads 1 gpu_tests
step 20 $B/gemm $OUT/nvidia-h200.ron 4
step 40 python3 examples/python/glm5_expert.py --table $OUT/nvidia-h200.ron --lib $B/libfp4tune.so
step 30 sh -c "cc examples/c/gemm.c -I include -L $B -lfp4tune -l:libcuda.so.1 -Wl,-rpath,\$PWD/$B -o /tmp/gemm_c && /tmp/gemm_c $OUT/nvidia-h200.ron"
mkdir -p $OUT/bench; step 190 $B/fp4tune bench --sets tp8,tp4,ep8 --only routed --m 1,4,16,1024 --max-candidates 150 --out $OUT/bench
if [ "${SUITE:-1}" = 1 ]; then
  step 580 $B/gpu_gemm --test-threads 1 --nocapture every_variant_matches_the_cpu_reference_w4a16
  step 580 $B/gpu_gemm --test-threads 1 --nocapture every_variant_matches_the_cpu_reference_w4a4
fi
if [ "${EXTRA:-1}" = 1 ]; then
  mkdir -p $OUT/w4a4 $OUT/prefill
  step 150 $B/fp4tune bench --sets tp8,tp4,ep8 --only routed --a-type w4a4 --m 1,16 --max-candidates 100 --out $OUT/w4a4
  step 150 $B/fp4tune bench --sets tp8,tp4,ep8 --only routed --m 256,1024 --max-candidates 60 --out $OUT/prefill
fi
grep -v "running for over" $LOG | tail -60
