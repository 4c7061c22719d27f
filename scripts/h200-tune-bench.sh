#!/usr/bin/env bash
# The device call behind results/nvidia-h200.ron and results/h200/bench-w4a16.md (session 4): tune first,
# then the table check, runtime GPU tests, the Rust/Python/C examples, the benchmark, and the GPU suite
# restricted to the register pipeline (the whole suite ran in the next call: .device-bin/gpu_gemm --test-threads 2).
# Binaries as in the header of scripts/h200-run.sh; writes into $OUT.
set -u
OUT=${OUT:-$PWD/h200-out}; mkdir -p "$OUT"
export FP4TUNE_CACHE=${FP4TUNE_CACHE:-/tmp/fp4c}; B=${B:-.device-bin}; LOG=$OUT/logs.txt
step() { local t=$1; shift; echo "== $* (limit ${t}s, at ${SECONDS}s)" >> "$LOG"; timeout "$t" "$@" >> "$LOG" 2>&1; echo "== exit $? at ${SECONDS}s" >> "$LOG"; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv >> $LOG 2>&1
step 150 $B/fp4tune tune --only routed --max-m 1024 --strategy model --budget 0.02 --out $OUT
step 20 $B/fp4tune table --check $OUT/nvidia-h200.ron --device 0
step 40 $B/fp4tune_lib --test-threads 1 runtime::gpu_tests
step 20 $B/gemm $OUT/nvidia-h200.ron 4
step 40 python3 examples/python/glm5_expert.py --table $OUT/nvidia-h200.ron --lib $B/libfp4tune.so
step 30 sh -c "cc examples/c/gemm.c -I include -L $B -lfp4tune -l:libcuda.so.1 -Wl,-rpath,\$PWD/$B -o /tmp/gemm_c && /tmp/gemm_c $OUT/nvidia-h200.ron"
mkdir -p $OUT/bench; step 160 $B/fp4tune bench --sets tp8,tp4,ep8 --only routed --m 1,4,16,1024 --max-candidates 150 --out $OUT/bench
FP4TUNE_SUITE_ONLY=_r step 150 $B/gpu_gemm --test-threads 2 --nocapture
grep -v "running for over" $LOG | tail -60
