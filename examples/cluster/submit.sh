#!/bin/bash
# Submit an 8-shard campaign and its merge, which starts once every shard succeeded.
set -euo pipefail
SHARDS=${1:-8}
cd "$(dirname "$0")"
tune=$(sbatch --parsable --array=0-$((SHARDS - 1)) tune-array.sbatch)
sbatch --dependency=afterok:"$tune" merge.sbatch
