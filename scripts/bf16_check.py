#!/usr/bin/env python3
"""A random-weight bf16 checkpoint of Qwen2.5-1.5B's shape, loaded by
statebench at its file size and compared with transformers.

usage: scripts/bf16_check.py [--dir DIR] [--statebench BIN] [--keep]

Writes the checkpoint (Qwen2ForCausalLM, hidden 1536, 28 layers, 12 heads,
2 KV heads, MLP 8960, vocab 151936, tied embeddings; about 3.1 GB of bf16
safetensors) to DIR (a temporary directory unless given), computes
transformers' last-position logits and an 8-token greedy continuation in f32
(bf16 weights widen exactly, so both engines start from the same values),
runs `statebench check logits` on the same tokens under /usr/bin/time, and
prints the file size, statebench's peak resident memory, the largest logit
difference and whether the greedy tokens agree. Needs python3 with torch,
transformers and safetensors, and a release build of statebench.
"""

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
from make_random_checkpoints import init_weights  # noqa: E402
TOKENS = [5, 17, 42, 99, 250, 7, 123, 64]
GREEDY = 8


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path)
    ap.add_argument("--statebench", type=Path, default=ROOT / "target/release/statebench")
    ap.add_argument("--keep", action="store_true", help="keep the checkpoint")
    a = ap.parse_args()

    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    out = a.dir or Path(tempfile.mkdtemp(prefix="bf16-check-"))
    out.mkdir(parents=True, exist_ok=True)
    try:
        cfg = Qwen2Config(
            vocab_size=151936,
            hidden_size=1536,
            intermediate_size=8960,
            num_hidden_layers=28,
            num_attention_heads=12,
            num_key_value_heads=2,
            max_position_embeddings=32768,
            rope_theta=1_000_000.0,
            rms_norm_eps=1e-6,
            tie_word_embeddings=True,
        )
        torch.manual_seed(0)
        model = Qwen2ForCausalLM(cfg)
        # The tiny fixtures' seeded init: logits spread enough for a clear argmax.
        init_weights(model, 1, {"embed_std": 1.0, "resid_scale": 2.0, "lm_head_scale": 1.0})
        model = model.to(torch.bfloat16)
        model.save_pretrained(out, safe_serialization=True)
        for f in ["tokenizer.json", "tokenizer_config.json"]:
            shutil.copy(ROOT / "tests/fixtures/engine/tiny-qwen2" / f, out / f)
        file_bytes = sum(p.stat().st_size for p in out.glob("*.safetensors"))

        model = model.float().eval()
        ids = torch.tensor([TOKENS])
        with torch.no_grad():
            ref_last = model(ids).logits[0, -1].tolist()
            seq = list(TOKENS)
            for _ in range(GREEDY):
                nxt = model(torch.tensor([seq])).logits[0, -1]
                seq.append(int(torch.argmax(nxt)))
        ref_greedy = seq[len(TOKENS):]
        del model

        cmd = [
            "/usr/bin/time", "-f", "maxrss_kb %M",
            str(a.statebench), "check", "logits", "--device", "cpu",
            "--model", str(out),
            "--tokens", ",".join(map(str, TOKENS)),
            "--greedy", str(GREEDY),
        ]
        run = subprocess.run(cmd, capture_output=True, text=True)
        if run.returncode != 0:
            print(run.stderr, file=sys.stderr)
            return 1
        ours = json.loads(run.stdout.strip().splitlines()[-1])
        rss_kb = int(
            next(l for l in run.stderr.splitlines() if l.startswith("maxrss_kb")).split()[1]
        )
        diff = max(abs(x - y) for x, y in zip(ours["last_logits"], ref_last))
        spread = max(ref_last) - min(ref_last)
        print(f"checkpoint: {file_bytes / 1e9:.3f} GB of bf16 safetensors in {out}")
        print(f"statebench peak resident memory: {rss_kb * 1024 / 1e9:.3f} GB "
              f"({rss_kb * 1024 / file_bytes:.2f}x the file)")
        print(f"last-position logits: max |statebench - transformers| = {diff:.2e} "
              f"(logit range {spread:.1f})")
        print(f"greedy {GREEDY} tokens: statebench {ours['greedy']}, transformers {ref_greedy}, "
              f"{'equal' if ours['greedy'] == ref_greedy else 'DIFFERENT'}")
        return 0 if ours["greedy"] == ref_greedy and diff < 1e-2 * max(spread, 1.0) else 1
    finally:
        if not a.keep and a.dir is None:
            shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
