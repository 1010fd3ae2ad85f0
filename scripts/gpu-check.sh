#!/usr/bin/env bash
# statebench's first run on a machine with an NVIDIA GPU: `statebench check
# gpu` with an NVRTC chosen for the driver. Build here first
# (scripts/gpu-build.sh writes target/gpu/statebench), carry target/gpu with
# the repository, then on the GPU machine, from the repository root:
#
#     bash scripts/gpu-check.sh [check gpu's flags: --model M, --device cuda:N, ...]
#
# Prints check gpu's JSON and writes it to $OUT/gpu-check.json when OUT is
# set (else ./gpu-check.json): attach that file to a bug report. Then, where
# python3 has PyTorch, scripts/gpu_check.py measures speed and compares
# with PyTorch and transformers ($OUT/gpu-speed.json). At most 9 minutes.
#
# The NVRTC: STATEBENCH_NVRTC_DIR when set; else, of the libnvrtc.so.* found
# in the CUDA toolkits under /usr/local and in Python's nvidia-* wheels, the
# newest of the driver's own CUDA major version, else the newest older one
# (a newer major's kernels never load on this driver). The choice is
# printed, and check gpu reports the version it loaded.
set -u
cd "$(dirname "$0")/.."
BIN=${STATEBENCH_BIN:-target/gpu/statebench}
[ -x "$BIN" ] || BIN=target/release/statebench

smi=$(nvidia-smi 2>/dev/null)
driver=$(printf '%s\n' "$smi" | sed -n 's/.*CUDA Version: *\([0-9][0-9]*\)\.\([0-9]*\).*/\1 \2/p' | head -1)
driver_major=${driver%% *}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || true
echo "driver CUDA version: ${driver:+${driver/ /.}}${driver:-unknown (no nvidia-smi)}"

# Every directory holding a libnvrtc, with the version its file names carry
# (libnvrtc.so.12.4.127, or libnvrtc.so.13 alone), one "version dir" a line.
candidates() {
    {
        ls -d /usr/local/cuda*/lib64 /usr/local/cuda*/targets/*/lib 2>/dev/null
        python3 - <<'PY' 2>/dev/null
import glob, os, site
roots = site.getsitepackages() + [site.getusersitepackages()]
for root in roots:
    for f in glob.glob(os.path.join(root, "nvidia", "**", "libnvrtc.so*"), recursive=True):
        print(os.path.dirname(f))
PY
    } | sort -u | while read -r d; do
        best=""
        for f in "$d"/libnvrtc.so.*; do
            [ -e "$f" ] || continue
            v=${f##*/libnvrtc.so.}
            case "$v" in *[!0-9.]*|"") continue ;; esac
            # The longest version string names the library most exactly.
            [ ${#v} -gt ${#best} ] && best=$v
        done
        [ -n "$best" ] && echo "$best $d"
    done
}

if [ -n "${STATEBENCH_NVRTC_DIR:-}" ]; then
    chosen=$STATEBENCH_NVRTC_DIR
    echo "NVRTC: $chosen (STATEBENCH_NVRTC_DIR)"
else
    list=$(candidates | sort -t. -k1,1n -k2,2n -k3,3n)
    printf '%s\n' "$list" | sed -n 's/^/NVRTC found: /p'
    chosen=""
    if [ -n "$driver_major" ]; then
        # The newest of the driver's major, else the newest below it.
        chosen=$(printf '%s\n' "$list" | awk -v m="$driver_major" '{split($1, v, "."); if (v[1] == m) d = $2} END {print d}')
        [ -n "$chosen" ] || chosen=$(printf '%s\n' "$list" | awk -v m="$driver_major" '{split($1, v, "."); if (v[1] < m) d = $2} END {print d}')
    else
        chosen=$(printf '%s\n' "$list" | tail -1 | cut -d' ' -f2-)
    fi
    echo "NVRTC chosen: ${chosen:-none found (check gpu will say what to install)}"
fi
if [ -n "$chosen" ]; then
    export LD_LIBRARY_PATH="$chosen${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi

json="${OUT:-.}/gpu-check.json"
timeout 240 "$BIN" check gpu --json "$json" "$@"
rc=$?
echo "check gpu: exit $rc; report in $json"

# Then, where python3 has PyTorch: speed on a Qwen3-8B-shaped checkpoint
# beside PyTorch and the performance model, the tiny models against
# transformers, the device tests and a live cell (scripts/gpu_check.py,
# its rows in $OUT/gpu-speed.json). Skipped when check gpu failed: its
# first failure is what to fix first.
if [ "$rc" -eq 0 ] && python3 -c 'import torch' 2>/dev/null; then
    export PYTHONUNBUFFERED=1 GPU_CHECK_SECONDS=${GPU_CHECK_SECONDS:-300}
    timeout $((GPU_CHECK_SECONDS + 20)) python3 scripts/gpu_check.py
    rc=$?
    echo "gpu_check.py: exit $rc"
fi
exit $rc
