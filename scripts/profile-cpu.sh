#!/usr/bin/env bash
# Where the CPU engine's cycles go, figure by figure: prefill of a
# 512-token prompt, decode at batches 1, 4, 16 and 32 (64-token contexts,
# as scripts/compare-llamacpp.sh measures them) and, with --cell, the live
# cell. Each figure runs under `perf record`, sampling only while statebench
# times it (`statebench bench --perf-control`), and its samples are summed
# by what the code does; prints one Markdown table, shares of each column's
# samples. Run it on the host whose figures you want to explain.
#
#   scripts/profile-cpu.sh                 # the engine figures
#   scripts/profile-cpu.sh --isa avx512    # capped at a kernel family
#   scripts/profile-cpu.sh --cell          # and the live cell (whole run,
#                                          # model load included; minutes)
#   scripts/profile-cpu.sh --weights native   # weights at the file's bits
#   KEEP=1 scripts/profile-cpu.sh          # keep perf's data, for
#                                          # `perf report -i` or `annotate`
#
# Needs Linux perf (Debian: linux-perf) allowed to sample this user's
# processes (kernel.perf_event_paranoid ≤ 2). Samples count cpu-clock
# time, which every host and VM offers; the int8 product kernels' integer
# dots and their f32 scale steps share one loop, so they are one row
# (docs: the book's CPU chapter says what bounds them).
set -euo pipefail
cd "$(dirname "$0")/.."

THREADS=${THREADS:-2}
MODEL=${MODEL:-models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf}
CELL=0
WEIGHTS=widened
note() { printf '%s\n' "$*" >&2; }
while [ $# -gt 0 ]; do
    case $1 in
        --cell) CELL=1 ;;
        --isa)
            [ $# -ge 2 ] || { note "--isa needs a kernel family (scalar|avx2|avx512|amx|neon)"; exit 2; }
            export STATEBENCH_CPU_ISA=$2
            shift
            ;;
        --weights)
            [ $# -ge 2 ] || { note "--weights needs a layout (widened|native)"; exit 2; }
            WEIGHTS=$2
            shift
            ;;
        *) note "unknown argument $1 (--cell, --isa FAMILY, --weights LAYOUT)"; exit 2 ;;
    esac
    shift
done
command -v perf >/dev/null || { note "perf not found (Debian: apt install linux-perf)"; exit 2; }
perf record -q -e cpu-clock -o /dev/null -- true 2>/dev/null ||
    { note "perf cannot sample here (kernel.perf_event_paranoid is $(cat /proc/sys/kernel/perf_event_paranoid); 2 or less is needed)"; exit 2; }
[ -f "$MODEL" ] || bash models/fetch.sh
[ -x target/release/statebench ] || cargo build --release
SB=target/release/statebench
OUT=$(mktemp -d)
trap '[ -n "${KEEP:-}" ] || rm -rf "$OUT"' EXIT
[ -n "${KEEP:-}" ] && note "perf data kept in $OUT"

# One figure: `statebench bench` with the other figures at their smallest,
# perf enabled only while the figure is timed.
profile() {
    local name=$1
    shift
    mkfifo "$OUT/ctl.$name" "$OUT/ack.$name"
    perf record -q -e cpu-clock -F 1999 -D -1 --control "fifo:$OUT/ctl.$name,$OUT/ack.$name" \
        -o "$OUT/$name.data" -- \
        "$SB" bench --device cpu --model "$MODEL" --threads "$THREADS" --weights "$WEIGHTS" --turns 0 \
        --perf-control "$OUT/ctl.$name,$OUT/ack.$name" "$@" >"$OUT/$name.txt" 2>"$OUT/$name.err" ||
        { note "$name: $(tail -1 "$OUT/$name.err")"; exit 1; }
    perf report -i "$OUT/$name.data" --no-children --sort symbol --stdio -g none \
        >"$OUT/$name.report" 2>/dev/null
    # The figure's own line: decode's where a batch was the figure.
    note "$name: $(grep -E "^$([ "$name" = prefill ] && echo prefill || echo decode)" "$OUT/$name.txt")"
}

note "statebench: ${STATEBENCH_CPU_ISA:-its widest} kernel family, $THREADS threads, --weights $WEIGHTS"
FIGURES=(prefill b1 b4 b16 b32)
profile prefill --prefill-tokens 512 --batches 1 --decode-steps 1
profile b1 --prefill-tokens 16 --batches 1 --decode-steps 96 --decode-context 64
profile b4 --prefill-tokens 16 --batches 4 --decode-steps 64 --decode-context 64
profile b16 --prefill-tokens 16 --batches 16 --decode-steps 32 --decode-context 64
profile b32 --prefill-tokens 16 --batches 32 --decode-steps 32 --decode-context 64
if [ "$CELL" = 1 ]; then
    # The whole run: a cell has no single timed part to mark.
    perf record -q -e cpu-clock -F 1999 -o "$OUT/cell.data" -- \
        "$SB" ladder cell --agent model --steps 5 --episodes 2 --concurrency 8 --quiet \
        --device cpu --model "$MODEL" --threads "$THREADS" --weights "$WEIGHTS" --out "$OUT/cell" >/dev/null 2>"$OUT/cell.err" ||
        { note "cell: $(tail -1 "$OUT/cell.err")"; exit 1; }
    perf report -i "$OUT/cell.data" --no-children --sort symbol --stdio -g none \
        >"$OUT/cell.report" 2>/dev/null
    note "cell: $(grep -o 'ran .*' "$OUT/cell.err" | tail -1)"
    FIGURES+=(cell)
fi

python3 - "$OUT" "${FIGURES[@]}" <<'EOF'
import re, sys

out, figures = sys.argv[1], sys.argv[2:]
# What the code does, by symbol; the first pattern that matches wins.
KINDS = [
    ("activation quantization", r"quantize|tile_blocks|half_sums"),
    ("weight unpacking (`--weights native`; in the cell also the load's widening)",
     r"native::widen|native::Widen>|unpack"),
    ("loading the model (cell only: its whole run)", r"sha2|gguf|pack_|interleave|copy_to_iter|filemap|read_iter"),
    ("int8 products (integer dots and their f32 scale steps, results placed)",
     r"statebench_kernels::(q8|kq|pair|amx)::|matmul::(in_tiles|write_tile|tiles_amx|matmul_)|Matrix::matmul"),
    ("attention", r"attention::|attend"),
    ("KV-cache writes", r"kv_write|kv_cache"),
    ("SwiGLU, norms, RoPE, residual adds, greedy picks",
     r"silu_mul|rms_norm|rope|expf|Device>::add|add_bias|argmax|gather|embed"),
    ("threads: wake-ups and waits",
     r"rayon|crossbeam|futex|schedule|_raw_spin|sched_|wake|switch_to|finish_task|pthread|syscall|sysret|entry_SYSCALL|__lll|native_queued|irq"),
    ("memory: copies, clears, page faults",
     r"memmove|memcpy|memset|clear_page|page_fault|_mm_|mm_fault|alloc_pages|folio|anonymous_page|munmap|unmap|malloc|cfree|_int_free|_int_malloc|realloc|brk|cgroup|lru|rmap|pte|mas_"),
]
rows = {k: {} for k, _ in KINDS}
rows["other (the forward pass's own code, closures, the engine's scheduler)"] = {}
line = re.compile(r"^\s+([\d.]+)%\s+\[[.k]\]\s+(.*?)\s+-\s+-\s*$")
for f in figures:
    for l in open(f"{out}/{f}.report"):
        m = line.match(l)
        if not m:
            continue
        share, sym = float(m.group(1)), m.group(2)
        kind = next((k for k, p in KINDS if re.search(p, sym)), None) or list(rows)[-1]
        rows[kind][f] = rows[kind].get(f, 0.0) + share
print("| share of samples | " + " | ".join(figures) + " |")
print("| --- |" + " --- |" * len(figures))
for kind, by in rows.items():
    if any(v >= 0.5 for v in by.values()):
        print(f"| {kind} | " + " | ".join(f"{by.get(f, 0.0):.0f} %" for f in figures) + " |")
EOF
