#!/usr/bin/env bash
# Builds what scripts/gpu-check.sh runs on a GPU machine that has no Rust:
# the release binary and the device test binary, for any x86-64 host
# (x86-64-v2, not this machine's -C target-cpu=native), stripped, into
# target/gpu/. Carry that folder with the repository.
set -euo pipefail
cd "$(dirname "$0")/.."
export RUSTFLAGS="-C target-cpu=x86-64-v2"
dir=target/gpu-build
cargo build --release --target-dir "$dir" --bin statebench
tests=$(cargo test --release --target-dir "$dir" --test devices --no-run --message-format=json \
    | python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "devices":
        print(m["executable"])')
mkdir -p target/gpu
strip -o target/gpu/statebench "$dir/release/statebench"
strip -o target/gpu/devices "$tests"
ls -l target/gpu
