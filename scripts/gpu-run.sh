#!/usr/bin/env bash
# Reproduces the GPU evidence in results/ on a machine with an NVIDIA GPU, in phases whose step
# limits add up to at most 590 s, so each fits one 10-minute call (results/README.md says which
# file each command writes):
#   tests        the self-test, the grouped suites (W4A16 and W4A4), a foreign table refused, the
#                Python layer example (results/h200/gpu-tests.md, example-moe-layer.txt)
#   tests-lib    the library's other GPU tests (routing forms, order kernels, routes, two-stream
#                workspaces, the committed grouped entries, the CI gate's slowed-kernel test, the
#                self-test of the committed table)
#   retune-w4a4  on an H200: the W4A4 grouped entries of both committed tables re-tuned (B =
#                1..512) into copies at $OUT/retune-tp8/ and $OUT/retune-ep8/ (with their logs:
#                results/h200/*-moe-w4a4-retune.jsonl.gz), each new table self-tested
#   moe-w4a16    the torch peers and the grouped benchmark, W4A16, TP8 and EP8: $OUT/moe/ holds
#                bench-moe.md, .csv and bench-moe-w4a16-screen.csv (both sets' fp4tune rows, the
#                peers once: results/h200/bench-moe.*)
#   moe-w4a4     the same for W4A4: $OUT/moe-w4a4/bench-moe.md, .csv, bench-moe-w4a4-screen.csv
#                (results/h200/bench-moe-w4a4.md, .csv, bench-moe-w4a4-screen.csv)
#   tune         the README's main job from an empty cubin cache, timed (tune-default.md)
#   gemm         the table check, the GEMM benchmarks (bench-w4a16*, bench-w4a4*), the C, Rust
#                and Python GEMM examples
#   suite-w4a16, suite-w4a4   the GPU correctness suite of every GEMM variant
#   probe-bulk   the grouped probe's bulk mode (scripts/probes/grouped_probe.cu, built with nvcc):
#                the TP8 gate_up pick against its loads alone and the kernels fed by bulk copies,
#                TP8 B = 1..256 and EP8 B = 8..128 ($OUT/probe-bulk.txt; results/h100/probe-bulk.txt
#                on an H100, results/h200/probe-grouped.txt call 4 for the loads alone)
# Usage: OUT=<folder> scripts/gpu-run.sh [phase ...]   (no phase: all of them, in this order)
# (TABLES=<tp8 table>,<ep8 table> benchmarks other tables than the committed ones; PACK=1 leaves
# $OUT with log.txt and one archive, outputs.tar.gz, of every other file the phases wrote)
#
# Binaries come prebuilt in $B (default .device-bin/), so the GPU machine needs CUDA, Python with
# torch (the peers, the Python examples) and a C compiler, but no cargo:
#   cargo build --release && cargo build --release --example gemm
#   cargo test --release -p fp4tune --features gpu --no-run   # prints the test executables
#   cp target/release/{fp4tune,libfp4tune.so,examples/gemm} .device-bin/
#   cp <unittests src/lib.rs executable> .device-bin/fp4tune_lib
#   cp <tests/gpu_gemm.rs executable> .device-bin/gpu_gemm
# Every step has its own time limit, so one slow step cannot take the others' results with it;
# the whole output of every step goes to $OUT/log.txt. The cubin cache is $FP4TUNE_CACHE (default
# /tmp/fp4tune-cache; kernels compiled on another machine are used only if its NVRTC build, which
# `fp4tune compile` prints, is this machine's).
set -u
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
export FP4TUNE_CACHE=${FP4TUNE_CACHE:-/tmp/fp4tune-cache}
B=${B:-.device-bin}
LOG=$OUT/log.txt
TABLES=${TABLES:-results/nvidia-h200.ron,results/nvidia-h200-ep8.ron} # the grouped benchmarks' tables
step() {
  local t=$1
  shift
  {
    echo "== $* (limit ${t}s, at ${SECONDS}s)"
    timeout -k 10 "$t" "$@"
    echo "== exit $? at ${SECONDS}s"
  } >> "$LOG" 2>&1
}

# One bench-moe.csv of both sets: each set's fp4tune rows, the peers once (and one screen CSV,
# its header once); rendered with the TP8 report's title and provenance, its command line naming
# both runs.
merge_moe() { # <tp8 dir> <ep8 dir> <peers csv> <out dir> <a_type> <command of both runs>
  local screen=bench-moe-$5-screen.csv
  mkdir -p "$4"
  {
    {
      head -n 1 "$1/bench-moe.csv"
      tail -n +2 "$1/bench-moe.csv" | awk -F, '$7 !~ /^torch_/'
      tail -n +2 "$2/bench-moe.csv" | awk -F, '$7 !~ /^torch_/'
      tail -n +2 "$3"
    } > "$4/bench-moe.csv"
    { cat "$1/$screen"; tail -n +2 "$2/$screen"; } > "$4/$screen"
    sed "s|^Command: .*|Command: \`$6\`|" "$1/bench-moe.md" > "$4/bench-moe.md"
  } >> "$LOG" 2>&1
  step 20 "$B/fp4tune" bench --moe --render "$4/bench-moe.csv" --out "$4"
}

phase_tests() { # 310 s (on an H200 the three grouped steps take about 18, 76 and 101 s)
  step 40 "$B/fp4tune" selftest
  step 100 "$B/fp4tune_lib" --test-threads 1 grouped_moe_matches_the_cpu_reference
  step 125 "$B/fp4tune_lib" --test-threads 1 grouped_moe_w4a4_matches
  # a table of another GPU: one line each, no panic
  sed 's/name: "NVIDIA H200", compute_capability: (9, 0), sm_count: 132/name: "NVIDIA RTX PRO 6000 Blackwell Workstation Edition", compute_capability: (12, 0), sm_count: 188/' \
    results/nvidia-h200.ron > "$OUT/foreign-sm120.ron"
  step 10 "$B/fp4tune" table --check "$OUT/foreign-sm120.ron" --device 0
  step 10 "$B/fp4tune" selftest --table "$OUT/foreign-sm120.ron"
  step 25 python3 examples/python/glm5_moe_layer.py --table results/nvidia-h200.ron \
    --lib "$B/libfp4tune.so" --tokens 1 8 64
}

phase_tests-lib() { # 500 s (on an H100 the first step took about 200 s, the second 100 s)
  step 300 "$B/fp4tune_lib" --test-threads 1 the_order_kernels_match both_routing_forms \
    grouped_routes_name mma_probe_is_bit_exact split_k_launches_on_two \
    dequantize_then_cublas_on_two gemm_through_the_table untuned_dispatcher_runs \
    dequantize_then_cublas_entries dequant_then_cublas_matches committed_grouped_entries \
    the_per_expert_loop_is slowed_kernel_is_correct grouped_moe_takes_a_down_k
  step 200 "$B/fp4tune_lib" --test-threads 1 selftest_passes_on
}

phase_moe-w4a16() { # 580 s
  local ms=1,2,4,8,16,32,64,128,256,512,1024,4096 set
  step 60 python3 scripts/moe_peers.py --sets tp8,ep8 --m "$ms" --out "$OUT/moe-peers.csv"
  for set in tp8 ep8; do
    mkdir -p "$OUT/moe-$set"
    step 250 "$B/fp4tune" bench --moe --set "$set" --m "$ms" --a-type w4a16 --quick \
      --max-candidates 1 --peers "$OUT/moe-peers.csv" --table "$TABLES" --out "$OUT/moe-$set"
  done
  merge_moe "$OUT/moe-tp8" "$OUT/moe-ep8" "$OUT/moe-peers.csv" "$OUT/moe" w4a16 \
    "fp4tune bench --moe --set tp8 --m $ms --a-type w4a16 --quick --max-candidates 1 --peers moe-peers.csv --table $TABLES\` and the same with \`--set ep8"
}

phase_moe-w4a4() { # 580 s
  local ms=1,8,64,256,1024 set
  step 60 python3 scripts/moe_peers.py --sets tp8,ep8 --m "$ms" --out "$OUT/moe-peers-w4a4.csv"
  for set in tp8 ep8; do
    mkdir -p "$OUT/moe-w4a4-$set"
    step 250 "$B/fp4tune" bench --moe --set "$set" --m "$ms" --a-type w4a4 --quick \
      --max-candidates 12 --peers "$OUT/moe-peers-w4a4.csv" --table "$TABLES" \
      --out "$OUT/moe-w4a4-$set"
  done
  merge_moe "$OUT/moe-w4a4-tp8" "$OUT/moe-w4a4-ep8" "$OUT/moe-peers-w4a4.csv" "$OUT/moe-w4a4" w4a4 \
    "fp4tune bench --moe --set tp8 --m $ms --a-type w4a4 --quick --max-candidates 12 --peers moe-peers-w4a4.csv --table $TABLES\` and the same with \`--set ep8"
}

phase_retune-w4a4() { # 460 s, on an H200 only (the committed tables are the H200's)
  local b=1,2,4,8,16,32,64,128,256,512 set table
  case "$(nvidia-smi --query-gpu=name --format=csv,noheader)" in
    *H200*) ;;
    *)
      echo "== retune-w4a4 skipped: the committed tables are the H200's" >> "$LOG"
      return
      ;;
  esac
  for set in tp8 ep8; do
    table=results/nvidia-h200.ron
    [ "$set" = ep8 ] && table=results/nvidia-h200-ep8.ron
    mkdir -p "$OUT/retune-$set"
    cp "$table" "$OUT/retune-$set/nvidia-h200.ron"
    step 130 "$B/fp4tune" tune --set "$set" --moe-only --a-type w4a4 --moe-buckets "$b" \
      --out "$OUT/retune-$set"
    step 100 "$B/fp4tune" selftest --table "$OUT/retune-$set/nvidia-h200.ron" # EP8: about 92 s
  done
}

phase_tune() { # 570 s
  local cold
  cold=$(mktemp -d)
  mkdir -p "$OUT/tune-default"
  FP4TUNE_CACHE=$cold step 570 "$B/fp4tune" tune --out "$OUT/tune-default"
  rm -rf "$cold"
}

phase_gemm() { # 540 s
  step 20 "$B/fp4tune" table --check results/nvidia-h200.ron --device 0
  mkdir -p "$OUT/bench" "$OUT/w4a4" "$OUT/prefill"
  step 170 "$B/fp4tune" bench --set tp8,tp4,ep8 --only routed --m 1,4,16,1024 \
    --max-candidates 150 --out "$OUT/bench"
  step 130 "$B/fp4tune" bench --set tp8,tp4,ep8 --only routed --a-type w4a4 --m 1,16 \
    --max-candidates 100 --out "$OUT/w4a4"
  step 130 "$B/fp4tune" bench --set tp8,tp4,ep8 --only routed --m 256,1024 --max-candidates 60 \
    --out "$OUT/prefill"
  step 20 "$B/gemm" results/nvidia-h200.ron 4
  step 40 python3 examples/python/glm5_expert.py --table results/nvidia-h200.ron \
    --lib "$B/libfp4tune.so"
  step 30 sh -c "cc examples/c/gemm.c -I include -L $B -lfp4tune -l:libcuda.so.1 -Wl,-rpath,\$PWD/$B -o /tmp/gemm_c && /tmp/gemm_c results/nvidia-h200.ron"
}

phase_suite-w4a16() { # 580 s
  step 580 "$B/gpu_gemm" --test-threads 1 --nocapture every_variant_matches_the_cpu_reference_w4a16
}

phase_suite-w4a4() { # 580 s
  step 580 "$B/gpu_gemm" --test-threads 1 --nocapture every_variant_matches_the_cpu_reference_w4a4
}

phase_probe-bulk() { # 300 s
  step 120 nvcc -O3 -std=c++17 scripts/probes/grouped_probe.cu -o "$OUT/grouped_probe" -lnvrtc -lcuda
  local tp8 ep8
  {
    nvidia-smi --query-gpu=name --format=csv,noheader
    timeout -k 10 120 "$OUT/grouped_probe" bulk 1 8 64 128 256
    tp8=$?
    timeout -k 10 60 "$OUT/grouped_probe" bulk ep8 8 64 128
    ep8=$?
  } > "$OUT/probe-bulk.txt" 2>&1
  echo "== probe-bulk: exit $tp8 (TP8) and $ep8 (EP8) at ${SECONDS}s ($OUT/probe-bulk.txt)" >> "$LOG"
  rm -f "$OUT/grouped_probe"
}

nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv >> "$LOG" 2>&1
PHASES="tests tests-lib retune-w4a4 moe-w4a16 moe-w4a4 tune gemm suite-w4a16 suite-w4a4 probe-bulk"
# shellcheck disable=SC2086 # the list splits into its names
[ $# -eq 0 ] && set -- $PHASES
for phase in "$@"; do # every name checked before anything runs
  case " $PHASES " in
    *" $phase "*) ;;
    *)
      echo "unknown phase $phase ($PHASES)" >&2
      exit 2
      ;;
  esac
done
for phase in "$@"; do
  "phase_$phase"
done
if [ -n "${PACK:-}" ]; then
  (cd "$OUT" && find . -type f ! -name log.txt ! -name outputs.tar.gz | sort > /tmp/gpu-run-files &&
    tar -czf outputs.tar.gz -T /tmp/gpu-run-files && xargs rm -f < /tmp/gpu-run-files &&
    find . -mindepth 1 -type d -empty -delete) >> "$LOG" 2>&1
  echo "== packed into $OUT/outputs.tar.gz" >> "$LOG"
fi
grep -v "running for over" "$LOG" | grep -v "^test .* ok$" | tail -80
