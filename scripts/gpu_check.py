#!/usr/bin/env python3
"""statebench on an NVIDIA GPU: one table of what the CUDA engine does there.

Run by scripts/gpu-check.sh, after `statebench check gpu` passed, on a machine with a GPU, python3 with torch,
transformers and safetensors, and no Rust: the binaries come prebuilt from
scripts/gpu-build.sh (target/gpu/statebench, target/gpu/devices).

Parts, each reporting its own error and never stopping the others:
  (a) kernels: every CUDA operation against the CPU's on random inputs
      (`statebench check kernels`, each within its bf16 bound), and the CUDA
      tests of tests/devices.rs pointed at the GPU (STATEBENCH_TEST_GPU=real:
      kernels at model shapes, tiny models against their bf16 reference,
      split and unsplit attention bit for bit, graphs, invariance, KV
      exhaustion);
  (b) reference: tiny Qwen2/Qwen3 last-position logits against transformers
      on the same GPU, in f32 with the matrices rounded to bf16 (TF32 off):
      how far bf16 activations move them, and the greedy paths;
  (c) invariance: one request's token hash alone and in batches of 3, 32 and
      128 beside requests of other lengths, cached and cold, in two processes;
  (d) speed on a Qwen3-8B-shaped bf16 checkpoint made here: prefill tok/s
      (2k-token prompt), decode aggregate tok/s at batch 1, 32, 64, 128 with
      1k contexts, each beside its memory-bandwidth roofline, the
      performance model's prediction (`statebench bench --gpu-model`) and
      PyTorch running the same step's matrix products (cuBLAS) and attention
      (SDPA); the goals (batch 1 >= 180, batch 128 >= 9,000, prefill >=
      10,000 tok/s, each within 2x of PyTorch) decide its marks;
  (e) a live ladder cell on the tiny model through the whole pipeline.

Prints each row as it is made and rewrites $OUT/gpu-speed.json (when $OUT is
set) with every row so far, so a run cut short keeps what it measured.
DEVICE=cpu runs the statebench parts on the CPU (a dry run of the script).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(os.environ.get("STATEBENCH_BIN", ROOT / "target/gpu/statebench"))
TESTS = Path(os.environ.get("STATEBENCH_DEVICE_TESTS", ROOT / "target/gpu/devices"))
DEVICE = os.environ.get("DEVICE", "cuda")
OUT = os.environ.get("OUT")
BUDGET_S = float(os.environ.get("GPU_CHECK_SECONDS", "420"))
START = time.time()
WORK = Path(tempfile.mkdtemp(prefix="statebench-gpu-check-"))
TINY = ROOT / "tests/fixtures/engine"

# Tolerances and goals, stated once. The engine's activations are bf16
# (statebench-cuda/3): on the emulator they move the tiny models' logits
# from transformers' f32 ones (matrices rounded to bf16) by up to 0.14; the
# tight check is the Rust test against the same arithmetic on the host.
LOGIT_TOL = 0.3  # max abs, engine vs transformers f32 on bf16-rounded weights
GOALS = {"prefill": 10_000, 1: 180, 128: 9_000}  # tok/s on the Qwen3-8B shape

rows: list[dict] = []


def row(part: str, check: str, ok: bool | None, value: str, detail: str = "") -> None:
    """Records a row, prints it and rewrites $OUT/gpu-speed.json at once: a
    run cut short by its time limit still leaves every row it made."""
    rows.append({"part": part, "check": check, "ok": ok, "value": value, "detail": detail})
    mark = {True: "yes", False: "NO", None: "-"}[ok]
    print(f"{part:<26}  {check:<44}  {mark:<4}  {value}  {detail}", flush=True)
    if OUT:
        Path(OUT).mkdir(parents=True, exist_ok=True)
        (Path(OUT) / "gpu-speed.json").write_text(
            json.dumps({"rows": rows, "seconds": time.time() - START}, indent=1))


def left() -> float:
    return BUDGET_S - (time.time() - START)


def sb(*args: str, timeout: float = 300) -> str:
    """Runs the statebench binary; its stdout, or an error with stderr's last line."""
    p = subprocess.run([str(BIN), *args], capture_output=True, text=True,
                       timeout=max(10.0, min(timeout, left())))
    if p.returncode != 0:
        last = (p.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise RuntimeError(f"statebench {args[0]} {args[1] if len(args) > 1 else ''}: {last}")
    return p.stdout


def part(name: str):
    def wrap(fn):
        def run():
            t = time.time()
            try:
                fn()
            except Exception as e:  # every part reports its own failure
                row(name, "error", False, type(e).__name__, str(e).splitlines()[0][:300] if str(e) else "")
                traceback.print_exc(file=sys.stderr)
            row(name, "seconds", None, f"{time.time() - t:.1f}")
        return run
    return wrap


def long_context_copy(name: str) -> Path:
    """A tiny checkpoint with a 4096-token context, so whole episodes fit."""
    dst = WORK / f"{name}-long"
    if not dst.exists():
        shutil.copytree(TINY / name, dst)
        cfg = json.loads((dst / "config.json").read_text())
        cfg["max_position_embeddings"] = 4096
        (dst / "config.json").write_text(json.dumps(cfg))
    return dst


@part("a kernels")
def kernels() -> None:
    if DEVICE == "cpu":
        row("a kernels", "skipped", None, "DEVICE=cpu", "nothing to compare the CPU with")
        return
    for d in json.loads(sb("check", "kernels", "--device", DEVICE)):
        row("a kernels", d["kernel"], d["ok"], f"max abs {d['max_abs']:.2e}",
            f"{d['max_bf16_ulps']:.2f} bf16 units, {d['values']} values (bound: check::agrees)")
    if TESTS.exists():
        # The device tests run on the CUDA emulator unless told to use GPU 0.
        env = dict(os.environ, STATEBENCH_ROOT=str(ROOT), STATEBENCH_REQUIRE="1",
                   STATEBENCH_TEST_GPU="real", STATEBENCH_BIN=str(BIN))
        p = subprocess.run([str(TESTS), "cuda::", "--test-threads", "1"], capture_output=True,
                           text=True, env=env, timeout=max(10.0, min(240, left())))
        for line in p.stdout.splitlines():
            if line.startswith("test ") and " ... " in line:
                name, result = line[5:].split(" ... ", 1)
                row("a kernels", f"rust test {name}", result.startswith("ok"), result)
        if p.returncode != 0:
            fail = [l for l in p.stdout.splitlines() if "panicked" in l or "assert" in l]
            row("a kernels", "rust tests", False, f"exit {p.returncode}", " | ".join(fail)[:300])
    else:
        row("a kernels", "rust tests", None, "not carried", str(TESTS))


@part("b reference")
def reference() -> None:
    import torch
    from transformers import AutoModelForCausalLM

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = "cuda" if DEVICE != "cpu" and torch.cuda.is_available() else "cpu"
    for name in ["tiny-qwen2", "tiny-qwen3"]:
        d = TINY / name
        try:
            model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager")
        except TypeError:  # transformers before 4.56 names it torch_dtype
            model = AutoModelForCausalLM.from_pretrained(d, torch_dtype=torch.float32, attn_implementation="eager")
        model = model.to(dev).eval()
        with torch.no_grad():
            # The engine holds its matrices in bf16 and its vectors (norm
            # weights, biases) in f32: round the matrices alone.
            for p in model.parameters():
                if p.dim() == 2:
                    p.copy_(p.to(torch.bfloat16).to(torch.float32))
        cases = json.loads((d / "logits.json").read_text())["cases"]
        worst, same = 0.0, 0
        for c in cases:
            ids = c["input_ids"]
            out = json.loads(sb("check", "logits", "--device", DEVICE, "--model", str(d),
                                "--tokens", ",".join(map(str, ids)), "--greedy", "8"))
            with torch.no_grad():
                x = torch.tensor([ids], device=dev)
                ref = model(x).logits[0, -1].float().cpu()
                greedy, seq = [], list(ids)
                for _ in range(8):
                    nxt = int(model(torch.tensor([seq], device=dev)).logits[0, -1].argmax())
                    greedy.append(nxt)
                    seq.append(nxt)
            got = torch.tensor(out["last_logits"])
            worst = max(worst, float((got - ref).abs().max()))
            same += int(out["greedy"] == greedy)
        row("b reference", f"{name} logits vs transformers ({dev})", worst <= LOGIT_TOL,
            f"max abs {worst:.2e}", f"{len(cases)} prompts, tolerance {LOGIT_TOL}")
        row("b reference", f"{name} greedy paths", None, f"{same}/{len(cases)} equal",
            "8 tokens each; bf16 activations may flip near ties")


@part("c invariance")
def invariance() -> None:
    model = long_context_copy("tiny-qwen2")
    runs = []
    for proc in range(2):
        out = json.loads(sb("check", "invariance", "--device", DEVICE, "--model", str(model),
                            "--batches", "3,32,128", "--max-tokens", "24",
                            "--kv-budget-gib", "4"))
        runs.append(out)
        first = [o for o in out if not o["case"].startswith("second turn")]
        turns = [o for o in out if o["case"].startswith("second turn")]
        row("c invariance", f"process {proc + 1}: alone = batches of 3, 32, 128",
            len({o["hash"] for o in first}) == 1, " ".join(o["hash"] for o in first),
            ", ".join(f"{o['case']}: {o['tokens']} tokens" for o in first))
        row("c invariance", f"process {proc + 1}: cached prefix = cold", len({o["hash"] for o in turns}) == 1,
            " ".join(o["hash"] for o in turns), ", ".join(o["case"] for o in turns))
    row("c invariance", "process 1 = process 2", runs[0] == runs[1],
        "same hashes" if runs[0] == runs[1] else "differ")


QWEN3_8B = dict(hidden=4096, intermediate=12288, layers=36, heads=32, kv_heads=8, head_dim=128, vocab=151936)


def make_8b(dst: Path) -> int:
    """A Qwen3-8B-shaped bf16 checkpoint of seeded random weights; returns its bytes."""
    import torch
    from safetensors.torch import save_file

    s = QWEN3_8B
    dst.mkdir(parents=True, exist_ok=True)
    g = torch.Generator(device="cuda" if torch.cuda.is_available() else "cpu").manual_seed(0)
    dev = g.device

    def rnd(*shape, scale=0.02):
        return (torch.randn(*shape, generator=g, device=dev, dtype=torch.float32) * scale).to(torch.bfloat16).cpu()

    def ones(n):
        return torch.ones(n, dtype=torch.bfloat16)

    total = 0
    h, i, hd = s["hidden"], s["intermediate"], s["head_dim"]
    shards = [("model-embed.safetensors", {"model.embed_tokens.weight": rnd(s["vocab"], h),
                                           "lm_head.weight": rnd(s["vocab"], h),
                                           "model.norm.weight": ones(h)})]
    for l in range(s["layers"]):
        p = f"model.layers.{l}"
        shards.append((f"model-layer-{l:02d}.safetensors", {
            f"{p}.input_layernorm.weight": ones(h),
            f"{p}.post_attention_layernorm.weight": ones(h),
            f"{p}.self_attn.q_proj.weight": rnd(s["heads"] * hd, h),
            f"{p}.self_attn.k_proj.weight": rnd(s["kv_heads"] * hd, h),
            f"{p}.self_attn.v_proj.weight": rnd(s["kv_heads"] * hd, h),
            f"{p}.self_attn.o_proj.weight": rnd(h, s["heads"] * hd),
            f"{p}.self_attn.q_norm.weight": ones(hd),
            f"{p}.self_attn.k_norm.weight": ones(hd),
            f"{p}.mlp.gate_proj.weight": rnd(i, h),
            f"{p}.mlp.up_proj.weight": rnd(i, h),
            f"{p}.mlp.down_proj.weight": rnd(h, i),
        }))
    for fname, tensors in shards:
        save_file(tensors, str(dst / fname))
        total += sum(t.numel() * 2 for t in tensors.values())
    cfg = {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "hidden_size": h,
           "intermediate_size": i, "num_hidden_layers": s["layers"], "num_attention_heads": s["heads"],
           "num_key_value_heads": s["kv_heads"], "head_dim": hd, "vocab_size": s["vocab"],
           "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "max_position_embeddings": 40960,
           "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
    (dst / "config.json").write_text(json.dumps(cfg))
    for f in ["tokenizer.json", "tokenizer_config.json"]:
        shutil.copy(TINY / "tiny-qwen3" / f, dst / f)
    return total


def copy_bandwidth() -> float:
    """Device-to-device copy, bytes read plus written per second."""
    import torch

    x = torch.empty(1 << 30, dtype=torch.float32, device="cuda")  # 4 GiB
    y = torch.empty_like(x)
    for _ in range(3):
        y.copy_(x)
    torch.cuda.synchronize()
    t = time.time()
    n = 10
    for _ in range(n):
        y.copy_(x)
    torch.cuda.synchronize()
    return 2 * x.numel() * 4 * n / (time.time() - t)


def torch_tokens_per_s(m: int, context: int, sequences: int) -> float:
    """PyTorch on one Qwen3-8B forward step of m rows over `sequences`
    sequences, each row attending to `context` positions: every layer's
    projections (cuBLAS, bf16) and attention (SDPA: decode rows against
    their caches, or a causal prefill), and the output head."""
    import torch
    import torch.nn.functional as F

    s = QWEN3_8B
    h, i, hd = s["hidden"], s["intermediate"], s["head_dim"]
    shapes = [(h, s["heads"] * hd), (h, s["kv_heads"] * hd), (h, s["kv_heads"] * hd),
              (s["heads"] * hd, h), (h, i), (h, i), (i, h)]
    ws = [torch.randn(k, n, device="cuda", dtype=torch.bfloat16) for k, n in shapes]
    head = torch.randn(h, s["vocab"], device="cuda", dtype=torch.bfloat16)
    x = {k: torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for k in {h, i, s["heads"] * hd}}
    rows = m // sequences
    q = torch.randn(sequences, s["heads"], rows, hd, device="cuda", dtype=torch.bfloat16)
    kv = torch.randn(sequences, s["kv_heads"], context, hd, device="cuda", dtype=torch.bfloat16)
    group = s["heads"] // s["kv_heads"]

    def attend():
        try:
            return F.scaled_dot_product_attention(q, kv, kv, is_causal=rows > 1, enable_gqa=True)
        except TypeError:  # torch before 2.5: the KV heads repeated
            k = kv.repeat_interleave(group, dim=1)
            return F.scaled_dot_product_attention(q, k, k, is_causal=rows > 1)

    def step():
        for _ in range(s["layers"]):
            for (k, _n), w in zip(shapes, ws):
                x[k] @ w
            attend()
        x[h][-sequences:] @ head

    step()
    torch.cuda.synchronize()
    reps = 5 if m <= 128 else 2
    t = time.time()
    for _ in range(reps):
        step()
    torch.cuda.synchronize()
    return m * reps / (time.time() - t)


def predictions() -> dict:
    """The performance model's tok/s by scenario (decode batch, or 'prefill')."""
    out = {}
    for line in sb("bench", "--gpu-model").splitlines():
        if line.startswith("| decode, batch"):
            out[int(line.split("batch")[1].split(",")[0])] = float(line.split("|")[2].split("tok/s")[0])
        elif line.startswith("| prefill"):
            out["prefill"] = float(line.split("|")[2].split("tok/s")[0])
    return out


@part("d speed (Qwen3-8B shape)")
def speed() -> None:
    import torch

    if DEVICE == "cpu" or not torch.cuda.is_available():
        row("d speed (Qwen3-8B shape)", "skipped", None, "no GPU", "")
        return
    t = time.time()
    model = WORK / "qwen3-8b-shape"
    weight_bytes = make_8b(model)
    row("d speed (Qwen3-8B shape)", "checkpoint written", None, f"{weight_bytes / 1e9:.1f} GB",
        f"{time.time() - t:.0f} s")
    bw = copy_bandwidth()
    row("d speed (Qwen3-8B shape)", "copy bandwidth (torch)", None, f"{bw / 1e12:.2f} TB/s", "read + written")
    s = QWEN3_8B
    kv_per_token = s["layers"] * 2 * s["kv_heads"] * s["head_dim"] * 2  # bf16 keys and values
    predicted = predictions()
    # Prefill first: its rate decides how long the decode contexts can be.
    out = sb("bench", "--device", DEVICE, "--model", str(model), "--prefill-tokens", "2048",
             "--batches", "1", "--decode-steps", "4", "--decode-context", "64", "--turns", "0",
             "--kv-budget-gib", "48", timeout=240)
    prefill = float(out.split("prefill:")[1].split("=")[1].split("tok/s")[0])
    torch_prefill = torch_tokens_per_s(2048, 2048, 1)
    row("d speed (Qwen3-8B shape)", "prefill, 2048-token prompt",
        prefill >= GOALS["prefill"] and prefill >= 0.5 * torch_prefill, f"{prefill:.0f} tok/s",
        f"goal >= {GOALS['prefill']} and within 2x of PyTorch ({torch_prefill:.0f} tok/s); "
        f"predicted {predicted.get('prefill', 0):.0f}")
    # Decode at the stated 1k context: batches are dropped from the largest
    # down when the time left cannot prefill their contexts, never the
    # context shortened.
    context = 1024
    batches = [b for b in [1, 32, 64, 128] if b * context / prefill < (left() - 90) * 0.5]
    for b in sorted(set([1, 32, 64, 128]) - set(batches)):
        row("d speed (Qwen3-8B shape)", f"decode batch {b}, context {context}", None,
            "not measured", f"prefilling {b} x {context} tokens at {prefill:.0f} tok/s does not fit the time left")
    if not batches:
        return
    out = sb("bench", "--device", DEVICE, "--model", str(model), "--prefill-tokens", "16",
             "--batches", ",".join(map(str, batches)), "--decode-steps", "8",
             "--decode-context", str(context), "--turns", "0", "--kv-budget-gib", "48",
             timeout=max(60.0, left() - 30))
    for line in out.splitlines():
        if not line.startswith("decode: batch"):
            continue
        b = int(line.split("batch")[1].split(":")[0])
        tps = float(line.split(":")[2].split("tok/s")[0])
        step_bytes = weight_bytes + b * context * kv_per_token
        roof = b / (step_bytes / bw)
        torch_tps = torch_tokens_per_s(b, context, b)
        goal = GOALS.get(b)
        ok = tps >= 0.5 * torch_tps and (goal is None or tps >= goal)
        row("d speed (Qwen3-8B shape)", f"decode batch {b}, context {context}", ok,
            f"{tps:.0f} tok/s ({tps / roof:.0%} of roofline {roof:.0f})",
            f"PyTorch {torch_tps:.0f} tok/s; predicted {predicted.get(b, 0):.0f}"
            + (f"; goal >= {goal}" if goal else "") + "; within 2x of PyTorch")


@part("e live cell")
def live_cell() -> None:
    model = long_context_copy("tiny-qwen2")
    out = WORK / "cell"
    sb("ladder", "cell", "--agent", "model", "--device", DEVICE, "--model", str(model),
       "--arms", "raw,enforce", "--steps", "3", "--episodes", "2", "--out", str(out), "--quiet",
       "--kv-budget-gib", "4")
    episodes = [json.loads(l) for l in (out / "episodes.jsonl").read_text().splitlines() if l.strip()]
    turns = sum(1 for l in (out / "turns.jsonl").read_text().splitlines() if l.strip())
    manifest = json.loads((out / "manifest.json").read_text())
    tokens = sum(e["usage"]["completion_tokens"] for e in episodes)
    row("e live cell", "tiny Qwen2, raw + enforce, 2 episodes", len(episodes) == 4 and turns == 176,
        f"{len(episodes)} episode-arms, {turns} turns, {tokens} tokens",
        f"device {manifest['model'].get('device') or 'cpu'}")


def main() -> int:
    if not BIN.exists():
        print(f"{BIN}: not found (build it with scripts/gpu-build.sh and carry target/gpu)", file=sys.stderr)
        return 2
    try:
        import torch
        if torch.cuda.is_available():
            row("setup", "GPU", None, torch.cuda.get_device_name(0), f"torch {torch.__version__}")
    except Exception as e:
        row("setup", "torch", None, "unavailable", str(e)[:120])
    # What `check gpu` did not already show first, so a run cut short by
    # its budget keeps the speed figures.
    for p in [speed, reference, kernels, live_cell, invariance]:
        p()
    print(f"total {time.time() - START:.0f} s")
    shutil.rmtree(WORK, ignore_errors=True)
    return 1 if any(r["ok"] is False for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
