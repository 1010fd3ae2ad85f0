#!/usr/bin/env bash
# Shards driving one served model: start vLLM or SGLang once, e.g.
#   vllm serve Qwen/Qwen3-8B --port 8000 --max-num-seqs 256
#   python -m sglang.launch_server --model-path Qwen/Qwen3-8B --port 8000
# then run n shards against it; each keeps --concurrency requests in flight, so the
# server sees n x --concurrency concurrent conversations.
set -euo pipefail
ENDPOINT=${ENDPOINT:-http://127.0.0.1:8000}
N=${N:-4}
for i in $(seq 0 $((N - 1))); do
    statebench ladder grid docs/grid/table2.toml \
        --endpoint "$ENDPOINT" \
        --concurrency 32 \
        --shard "$i/$N" \
        --out "runs/table2-endpoint/shard-$i" \
        --quiet &
done
wait
statebench ladder report runs/table2-endpoint/shard-* --format md
