#!/usr/bin/env bash
# statebench's engine against llama.cpp on the same GGUF and threads, in
# interleaved rounds (statebench, llama.cpp, then llama.cpp, statebench, …)
# so both see the same neighbours on a shared machine; prints each figure's
# range per side and the ratio of the medians.
#
#   scripts/compare-llamacpp.sh            # engine figures, 3 rounds
#   ROUNDS=4 scripts/compare-llamacpp.sh
#   scripts/compare-llamacpp.sh --cell     # also a live cell: in-process
#                                          # against llama-server -np 8
#   scripts/compare-llamacpp.sh --isa avx512   # statebench capped at a
#                                          # kernel family (STATEBENCH_CPU_ISA)
#   scripts/compare-llamacpp.sh --isa avx2 # the laptop path: statebench's
#                                          # avx2 family against llama.cpp
#                                          # built with AVX-512 off
#
# llama.cpp is built on first use under target/llama.cpp from the vendored
# copy in the llama-cpp-python sdist on PyPI (cmake from PyPI when missing;
# the CPU's own instruction sets, or AVX2 at most with --isa avx2 or
# scalar, in build-avx2 beside the default build; no curl, no OpenSSL).
# LLAMA_BIN=DIR uses binaries you already have instead.
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS=${ROUNDS:-3}
THREADS=${THREADS:-2}
MODEL=${MODEL:-models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf}
WORK=target/llama.cpp
CELL=0
ISA=""
note() { printf '%s\n' "$*" >&2; }
while [ $# -gt 0 ]; do
    case $1 in
        --cell) CELL=1 ;;
        --isa)
            [ $# -ge 2 ] || { note "--isa needs a kernel family (scalar|avx2|avx512|amx|neon)"; exit 2; }
            ISA=$2
            shift
            ;;
        *) note "unknown argument $1 (--cell, --isa FAMILY)"; exit 2 ;;
    esac
    shift
done
# The cap reaches every statebench run below; statebench refuses one it
# cannot take before anything is measured.
if [ -n "$ISA" ]; then
    export STATEBENCH_CPU_ISA=$ISA
fi
# llama.cpp's counterpart of a family without AVX-512: a build with it off.
BUILD=build
case $ISA in
    avx2 | scalar) BUILD=build-avx2 ;;
esac

[ -f "$MODEL" ] || bash models/fetch.sh

build_llama() {
    local cmake
    cmake=$(command -v cmake || true)
    [ -z "$cmake" ] && [ -x "$WORK/tools/cmake/data/bin/cmake" ] && cmake="$WORK/tools/cmake/data/bin/cmake"
    if [ -z "$cmake" ]; then
        note "cmake: installing the PyPI wheel under $WORK/tools"
        python3 -m pip install --quiet --disable-pip-version-check --target "$WORK/tools" cmake
        cmake="$WORK/tools/cmake/data/bin/cmake"
    fi
    if [ ! -d "$WORK/src" ]; then
        note "llama.cpp: fetching the llama-cpp-python sdist with pip"
        mkdir -p "$WORK/sdist"
        # pip checks the archive against the index's hash. The source
        # distribution alone: `:all:` would build the metadata step's own
        # tools (cmake among them) from source too.
        python3 -m pip download --quiet --disable-pip-version-check --no-deps \
            --no-binary llama-cpp-python --dest "$WORK/sdist" llama-cpp-python
        local archive
        archive=$(ls "$WORK"/sdist/llama_cpp_python-*.tar.gz)
        tar -xzf "$archive" -C "$WORK/sdist"
        mv "$WORK"/sdist/llama_cpp_python-*/vendor/llama.cpp "$WORK/src"
        note "llama.cpp from $(basename "$archive" .tar.gz)"
        rm -rf "$WORK/sdist"
    fi
    # The CPU's own instruction sets, named one by one rather than
    # -march=native: ggml's AMX path crashed (SIGSEGV in
    # ggml_backend_amx_mul_mat) on a VM that reports AMX, so it stays off.
    local flags=() f wanted="avx avx2 fma f16c bmi2 avx512f avx512_vnni avx512_bf16 avx512vbmi avx_vnni"
    # The laptop path: AVX2, FMA and F16C, as statebench's avx2 family.
    [ "$BUILD" = build-avx2 ] && wanted="avx avx2 fma f16c bmi2"
    for f in $wanted; do
        if grep -qw "$f" /proc/cpuinfo; then
            case $f in
                avx512f) flags+=(-DGGML_AVX512=ON) ;;
                avx512_vnni) flags+=(-DGGML_AVX512_VNNI=ON) ;;
                avx512_bf16) flags+=(-DGGML_AVX512_BF16=ON) ;;
                avx512vbmi) flags+=(-DGGML_AVX512_VBMI=ON) ;;
                *) flags+=("-DGGML_$(echo "$f" | tr a-z A-Z)=ON") ;;
            esac
        fi
    done
    note "llama.cpp: building $WORK/$BUILD (${flags[*]})"
    "$cmake" -S "$WORK/src" -B "$WORK/$BUILD" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF \
        "${flags[@]}" -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF \
        -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DBUILD_SHARED_LIBS=OFF >/dev/null
    "$cmake" --build "$WORK/$BUILD" -j "$(nproc)" \
        --target llama-bench llama-batched-bench llama-server >/dev/null
}

LLAMA_BIN=${LLAMA_BIN:-$WORK/$BUILD/bin}
if [ ! -x "$LLAMA_BIN/llama-bench" ] || [ ! -x "$LLAMA_BIN/llama-batched-bench" ]; then
    build_llama
fi
[ -x target/release/statebench ] || cargo build --release
SB=target/release/statebench
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT

run_statebench() {
    "$SB" bench --device cpu --model "$MODEL" --threads "$THREADS" \
        --prefill-tokens 512 --batches 1,4,16,32 --decode-steps 32 --decode-context 64 \
        --turns 1 >"$OUT/sb.$1.txt"
}

run_llama() {
    "$LLAMA_BIN/llama-bench" -m "$MODEL" -t "$THREADS" -p 512 -n 0 -o csv \
        >"$OUT/lb.$1.csv" 2>/dev/null
    "$LLAMA_BIN/llama-batched-bench" -m "$MODEL" -t "$THREADS" -c 8192 -b 2048 -ub 512 \
        -npp 64 -ntg 32 -npl 1,4,16,32 >"$OUT/lbb.$1.txt" 2>/dev/null
}

note "statebench: ${STATEBENCH_CPU_ISA:-its widest} kernel family; llama.cpp: $LLAMA_BIN"
for r in $(seq 1 "$ROUNDS"); do
    note "round $r of $ROUNDS"
    if [ $((r % 2)) -eq 1 ]; then
        run_statebench "$r"
        run_llama "$r"
    else
        run_llama "$r"
        run_statebench "$r"
    fi
done

python3 - "$OUT" "$ROUNDS" "$LLAMA_BIN" <<'EOF'
import csv, glob, re, statistics, sys
out, rounds, llama = sys.argv[1], int(sys.argv[2]), sys.argv[3]
first = open(f"{out}/sb.1.txt").read()
family = re.search(r"\| cpu (\w+) kernels \|", first)
print(f"statebench: {family.group(1) if family else '?'} kernels; llama.cpp: {llama}; {rounds} rounds")
for line in first.splitlines():
    if line.startswith("host:"):
        print(line)
sb = {k: [] for k in ["prefill 512", "decode b1", "decode b4", "decode b16", "decode b32"]}
ll = {k: [] for k in sb}
for r in range(1, rounds + 1):
    text = open(f"{out}/sb.{r}.txt").read()
    sb["prefill 512"].append(float(re.search(r"prefill: \d+ tokens in [\d.]+s = ([\d.]+) tok/s", text).group(1)))
    for n, v in re.findall(r"decode: batch\s+(\d+): ([\d.]+) tok/s aggregate", text):
        sb[f"decode b{n}"].append(float(v))
    rows = list(csv.DictReader(open(f"{out}/lb.{r}.csv")))
    ll["prefill 512"].append(float(rows[0]["avg_ts"]))
    for line in open(f"{out}/lbb.{r}.txt"):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 8 and cells[0] == "64" and cells[1] == "32":
            ll[f"decode b{cells[2]}"].append(float(cells[7]))
print(f"{'figure':<14} {'statebench tok/s':>20} {'llama.cpp tok/s':>20} {'ratio':>7}")
for k in sb:
    a, b = sb[k], ll[k]
    if not a or not b:
        continue
    rng = lambda v: f"{min(v):.1f}-{max(v):.1f}" if len(v) > 1 else f"{v[0]:.1f}"
    print(f"{k:<14} {rng(a):>20} {rng(b):>20} {statistics.median(a) / statistics.median(b):>6.2f}x")
EOF

if [ "$CELL" -eq 1 ]; then
    # The same live cell (procurement S = 5, 2 episodes x 4 rungs, 8 live),
    # in-process and through llama-server with 8 slots driven by --endpoint.
    CELL_ARGS=(ladder cell --agent model --steps 5 --episodes 2 --concurrency 8 --quiet)
    t0=$(date +%s.%N)
    "$SB" "${CELL_ARGS[@]}" --device cpu --model "$MODEL" --threads "$THREADS" \
        --out "$OUT/in-process" >/dev/null
    t1=$(date +%s.%N)
    "$LLAMA_BIN/llama-server" -m "$MODEL" -t "$THREADS" -np 8 -c 65536 --port 8089 \
        >"$OUT/server.log" 2>&1 &
    server=$!
    for _ in $(seq 1 120); do
        curl -sf http://127.0.0.1:8089/health >/dev/null 2>&1 && break
        sleep 1
    done
    t2=$(date +%s.%N)
    "$SB" "${CELL_ARGS[@]}" --endpoint http://127.0.0.1:8089 --out "$OUT/served" >/dev/null
    t3=$(date +%s.%N)
    kill "$server"
    python3 - "$t0" "$t1" "$t2" "$t3" <<'EOF'
import sys
t0, t1, t2, t3 = map(float, sys.argv[1:])
a, b = t1 - t0, t3 - t2
print(f"live cell S=5, 2 episodes x 4 rungs, 8 live: in-process {a:.1f} s, "
      f"llama-server -np 8 via --endpoint {b:.1f} s: {b / a:.2f}x episodes/hour")
EOF
fi
