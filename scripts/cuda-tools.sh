#!/usr/bin/env bash
# Makes NVRTC, cuobjdump and nvdisasm available to fp4tune without a GPU or a CUDA toolkit.
# With a toolkit (CUDA_HOME, /usr/local/cuda) nothing is installed; otherwise NVIDIA's wheels are
# installed once into ./.cuda/, where fp4tune finds them on its own (no environment needed).
set -euo pipefail
cd "$(dirname "$0")/.."
have_toolkit() {
  for d in "${CUDA_HOME:-}" "${CUDA_PATH:-}" /usr/local/cuda; do
    [ -n "$d" ] && ls "$d"/lib64/libnvrtc.so* >/dev/null 2>&1 && [ -x "$d/bin/cuobjdump" ] && return 0
  done
  return 1
}
if have_toolkit; then
  echo "cuda-tools: using the installed CUDA toolkit"
  exit 0
fi
if [ -f .cuda/nvidia/cu13/lib/libnvrtc.so.13 ] && [ -x .cuda/nvidia/cu13/bin/cuobjdump ] \
   && [ -x .cuda/nvidia/cu13/bin/nvdisasm ]; then
  echo "cuda-tools: using the wheels in .cuda/"
  exit 0
fi
echo "cuda-tools: installing nvidia-cuda-nvrtc, nvidia-cuda-cuobjdump, nvidia-cuda-nvdisasm into .cuda/"
PY=$(command -v python3 || command -v python)
"$PY" -m pip install --quiet --disable-pip-version-check --no-warn-script-location \
  --target .cuda \
  "nvidia-cuda-nvrtc==13.0.88" "nvidia-cuda-cuobjdump==13.2.86" "nvidia-cuda-nvdisasm==13.2.86"
test -f .cuda/nvidia/cu13/lib/libnvrtc.so.13
