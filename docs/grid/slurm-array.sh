#!/usr/bin/env bash
# One grid over a Slurm job array: each array task runs one shard (statebench
# reads SLURM_ARRAY_TASK_ID and SLURM_ARRAY_TASK_COUNT), each on its own GPU,
# into its own directory. When all are done, one report merges the shards:
#   statebench ladder report runs/table2/shard-* --format md
# A task that is killed or preempted resumes where it stopped when resubmitted.
#SBATCH --job-name=statebench-table2
#SBATCH --array=0-7
#SBATCH --gres=gpu:1
#SBATCH --cpus-per-task=8
#SBATCH --time=24:00:00
#SBATCH --output=runs/table2/slurm-%A_%a.log
set -euo pipefail
statebench ladder grid docs/grid/table2.toml \
    --model "${MODEL:-Qwen/Qwen3-8B}" \
    --concurrency 64 \
    --out "runs/table2/shard-${SLURM_ARRAY_TASK_ID}" \
    --quiet
