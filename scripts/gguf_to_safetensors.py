#!/usr/bin/env python3
"""Dequantize a Qwen2/Qwen3 GGUF into a safetensors model directory.

The directory is what the engine's safetensors path loads: model.safetensors
(f32 by default: the exact dequantized values; bf16 with --dtype bfloat16),
config.json (from the GGUF metadata, with rope_theta and torch_dtype at the
top level as real checkpoints have them), generation_config.json,
tokenizer.json (transformers' conversion of the GGUF tokenizer),
tokenizer_config.json (with the GGUF's chat template).

It serves the GGUF-vs-safetensors agreement check: the same weights through
both loading paths. Dequantization is transformers' GGUF loader (which uses
the gguf package's dequantizers); a few tensors are checked against the gguf
package directly.

With --greedy FILE it also writes transformers' greedy continuations (f32,
eager attention) of a few chat prompts on the dequantized model, as JSON:
{"meta", "cases": [{"messages", "prompt", "prompt_ids", "greedy_ids", "text"}]}.

usage: python3 scripts/gguf_to_safetensors.py [--gguf PATH] [--out DIR]
                                              [--dtype float32|bfloat16] [--greedy FILE]
Default --out: models/<gguf stem>-<dtype>/ (not tracked by git).
Needs: torch, transformers, gguf, safetensors (about 2 GB of memory for the
default 0.5B model in f32).
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_GGUF = ROOT / "models" / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"

GREEDY_CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "user", "content": "What is 2+2? Answer with a number."}],
    [{"role": "system", "content": "You are a terse assistant."},
     {"role": "user", "content": "Name the largest planet in the solar system."}],
    [{"role": "user", "content": "Write a Python function that returns the square of x."}],
    [{"role": "user", "content": "Translate 'good morning' into French."}],
]
GREEDY_TOKENS = 32


def die(msg: str) -> None:
    print(f"gguf_to_safetensors: {msg}", file=sys.stderr)
    sys.exit(1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gguf", type=Path, default=DEFAULT_GGUF)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    ap.add_argument("--greedy", type=Path, default=None)
    args = ap.parse_args()
    if not args.gguf.is_file():
        die(f"GGUF not found: {args.gguf} (run models/fetch.sh)")
    out = args.out or (ROOT / "models" / f"{args.gguf.stem}-{args.dtype}")

    import numpy as np
    import torch
    import transformers
    from gguf import GGUFReader
    from gguf.quants import dequantize
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dtype = getattr(torch, args.dtype)
    reader = GGUFReader(str(args.gguf))
    chat_template = reader.fields["tokenizer.chat_template"].contents()

    model = AutoModelForCausalLM.from_pretrained(
        str(args.gguf.parent), gguf_file=args.gguf.name, dtype=torch.float32, attn_implementation="eager"
    )
    model.eval()
    tok = AutoTokenizer.from_pretrained(str(args.gguf.parent), gguf_file=args.gguf.name)

    # spot-check transformers' dequantization against the gguf package
    sd = model.state_dict()
    checks = {"token_embd.weight": "model.embed_tokens.weight",
              "blk.0.attn_q.weight": "model.layers.0.self_attn.q_proj.weight",
              "blk.0.ffn_down.weight": "model.layers.0.mlp.down_proj.weight",
              "blk.0.attn_q.bias": "model.layers.0.self_attn.q_proj.bias"}
    by_name = {t.name: t for t in reader.tensors}
    for gname, hname in checks.items():
        if gname not in by_name or hname not in sd:
            continue
        t = by_name[gname]
        ref = dequantize(t.data, t.tensor_type).reshape(tuple(int(x) for x in reversed(t.shape.tolist())))
        got = sd[hname].numpy()
        if got.shape != ref.shape or not np.array_equal(got, ref.astype(np.float32)):
            die(f"dequantized {gname} differs from {hname} ({t.tensor_type.name})")

    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    # transformers will not save_pretrained a GGUF-loaded model: write the
    # tensors and the config ourselves. The GGUF keeps output.weight apart from
    # token_embd.weight (quantized differently), so lm_head is its own tensor
    # and tie_word_embeddings is false, as transformers loads it.
    from safetensors.torch import save_file

    tensors = {k: v.detach().to(dtype).contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        tensors.pop("lm_head.weight", None)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    tok.save_pretrained(out)
    for extra in ("chat_template.jinja", "chat_template.json", "special_tokens_map.json"):
        (out / extra).unlink(missing_ok=True)

    cj = model.config.to_dict()
    cj.pop("quantization_config", None)
    cj.pop("_name_or_path", None)
    cj["architectures"] = [type(model).__name__]
    model.generation_config.to_json_file(str(out / "generation_config.json"))
    rp = cj.get("rope_parameters") or {}
    if "rope_theta" not in cj and "rope_theta" in rp:
        cj["rope_theta"] = rp["rope_theta"]
    cj["torch_dtype"] = args.dtype
    cj["dtype"] = args.dtype
    (out / "config.json").write_text(json.dumps(cj, indent=2, sort_keys=True) + "\n")

    tc = json.loads((out / "tokenizer_config.json").read_text())
    tc["chat_template"] = chat_template
    (out / "tokenizer_config.json").write_text(json.dumps(tc, indent=2, ensure_ascii=False) + "\n")

    if args.greedy:
        cases = []
        with torch.no_grad():
            for msgs in GREEDY_CONVERSATIONS:
                prompt = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
                ids = tok.encode(prompt, add_special_tokens=False)
                x = torch.tensor([ids])
                gen = model.generate(
                    x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=GREEDY_TOKENS,
                    eos_token_id=None, pad_token_id=tok.pad_token_id,
                )[0, len(ids):].tolist()
                cases.append({"messages": msgs, "prompt": prompt, "prompt_ids": ids, "greedy_ids": gen,
                              "text": tok.decode(gen, skip_special_tokens=False)})
        meta = {
            "description": "transformers greedy continuations (argmax, no stop token, "
                           f"{GREEDY_TOKENS} tokens) of the default GGUF dequantized to float32, "
                           "computed in float32 with eager attention. The engine's GGUF path uses "
                           "quantized matmuls, so its tokens may diverge after a near-tie; the "
                           "safetensors path on the dequantized weights should match closely.",
            "gguf_file": args.gguf.name,
            "versions": {"python": platform.python_version(), "torch": torch.__version__,
                         "transformers": transformers.__version__},
        }
        args.greedy.parent.mkdir(parents=True, exist_ok=True)
        args.greedy.write_text(json.dumps({"meta": meta, "cases": cases}, ensure_ascii=False, indent=1) + "\n")
        for c in cases:
            print(f"{c['messages'][-1]['content']!r} -> {c['text']!r}")

    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
