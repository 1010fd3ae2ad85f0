#!/usr/bin/env bash
# statebench's GPU check, for a machine with an NVIDIA GPU, python3 with
# torch, transformers and safetensors, and no Rust. Build here first
# (scripts/gpu-build.sh writes target/gpu/{statebench,devices}), carry
# target/gpu with the repository, then on the GPU machine, from the
# repository root:
#
#     bash scripts/gpu-check.sh
#
# Prints one table (kernels, reference logits, invariance, speed, a live
# cell); writes it as JSON to $OUT/gpu-check.json when OUT is set. Each
# part reports its own error; the whole run is bounded to 7 minutes.
set -u
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
# NVRTC 13: the CUDA toolkit's, or the nvidia-cuda-nvrtc wheel's.
nvrtc_dirs=$( { ls -d /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib 2>/dev/null
    python3 - <<'PY' 2>/dev/null
import glob, site, os
for root in site.getsitepackages() + [site.getusersitepackages()]:
    for f in glob.glob(os.path.join(root, "nvidia", "**", "libnvrtc.so*"), recursive=True):
        print(os.path.dirname(f))
PY
} | sort -u)
for d in $nvrtc_dirs; do
    LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
done
export LD_LIBRARY_PATH
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || true
timeout 430 python3 scripts/gpu_check.py "$@"
