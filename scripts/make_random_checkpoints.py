#!/usr/bin/env python3
"""Write tiny random-weight Qwen2 and Qwen3 checkpoints and their transformers logits.

Outputs, in tests/fixtures/engine/:

  tiny-qwen2/  Qwen2ForCausalLM, f32 safetensors, tied embeddings, q/k/v biases,
               vocab_size == tokenizer size (300).
  tiny-qwen3/  Qwen3ForCausalLM, bf16 safetensors, untied lm_head, q/k RMSNorm,
               head_dim 32 != hidden_size / num_attention_heads (16), vocab_size
               320 > tokenizer size (302: the model has padding rows, as real
               Qwen checkpoints do).

Each directory holds model.safetensors, config.json, generation_config.json,
tokenizer.json, tokenizer_config.json (with the chat template: Qwen2.5's for
tiny-qwen2, Qwen3's for tiny-qwen3) and logits.json (format below).

The tokenizer is a byte-level BPE trained here on a small corpus (256 byte
tokens + merges), with the Qwen2 normalizer / pre-tokenizer / decoder copied
from Qwen2's tokenizer.json (its split regex checked against the default
GGUF's tokenizer as transformers converts it), and the special
tokens <|endoftext|>, <|im_start|>, <|im_end|> appended after the BPE vocab
(tiny-qwen3 also has <think> and </think> as non-special added tokens).

Weights: seeded normal init scaled so activations are O(1) and logits are
well separated (HF's default 0.02 init gives near-uniform logits and fragile
argmax). RMSNorm weights are 1 + noise, biases are small noise.

logits.json:
  {"meta": {versions, dtype of the reference computation, model dir, ...},
   "cases": [{"name", "input_ids",
              "last_logits": [vocab_size floats]            (last position),
              "all_logits": [[vocab_size floats] per position] (only for the
                                                             7-token case),
              "greedy": [20 ids],      greedy continuation (argmax, ties to the
                                       lowest id, no stop token), full
                                       recompute each step, checked equal to
                                       transformers generate(do_sample=False)
                                       with the KV cache,
              "greedy_min_margin": smallest top1 - top2 logit gap along the
                                   greedy path}]}
Logits are computed in float32 (weights loaded from the saved files and
upcast, so bf16 rounding is what the engine sees), attn_implementation="eager".
Floats are written with 9 significant digits (exact for f32).

usage: python3 scripts/make_random_checkpoints.py [--out DIR]
Needs: torch, transformers, tokenizers, safetensors.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "tests" / "fixtures" / "engine"
FIXTURES = ROOT / "tests" / "fixtures" / "engine"
DEFAULT_GGUF = ROOT / "models" / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"

SEED = 20251130
GREEDY_TOKENS = 20
SEQ_LENGTHS = (1, 7, 33)
MIN_MARGIN = 0.05
MAX_DRAWS = 200
CHAT_QUESTIONS = [
    "What is the capital of France?",
    "Name a colour.",
    "Write a haiku about Rust.",
    "What is 2+2?",
    "Say hello.",
    "Count to three.",
]

# The Qwen2 (Qwen2.5 / Qwen3 share it) tokenizer pipeline, as in their
# tokenizer.json. Used when the GGUF is not available to copy it from.
QWEN2_PRETOKENIZER_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2_PIPELINE = {
    "normalizer": {"type": "NFC"},
    "pre_tokenizer": {
        "type": "Sequence",
        "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": QWEN2_PRETOKENIZER_REGEX},
             "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        ],
    },
    "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
}

CORPUS = [
    "The quick brown fox jumps over the lazy dog. The dog sleeps in the sun.",
    "What is the capital of France? The capital of France is Paris.",
    "You are a helpful assistant. Answer the question in one word.",
    "fn main() {\n    let x = 1;\n    println!(\"{}\", x + 1);\n}\n",
    "def add(a, b):\n    return a + b\n\nprint(add(1, 2))\n",
    "<|im_start|>user\nHello there!<|im_end|>\n<|im_start|>assistant\nHi! How can I help?<|im_end|>\n",
    "the the the and and and of of to to in in is is that that for for with with",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 and the year 2025, version 1.2.3.",
    "Ünïcödé café naïve 你好 世界 😀",
] * 3

TINY = {
    "tiny-qwen2": dict(
        arch="qwen2", dtype="float32", tie=True, head_dim=None, pad_vocab_to=None,
        embed_std=0.3, resid_scale=6.0, lm_head_scale=1.0,
        extra_tokens=[], template="qwen2.5_chat_template.jinja",
    ),
    "tiny-qwen3": dict(
        arch="qwen3", dtype="bfloat16", tie=False, head_dim=32, pad_vocab_to=320,
        embed_std=1.0, resid_scale=3.0, lm_head_scale=4.0,
        extra_tokens=["<think>", "</think>"], template="qwen3_chat_template.jinja",
    ),
}
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
BPE_VOCAB = 297  # 256 byte tokens + 41 merges; the 3 specials make 300


def versions() -> dict:
    import safetensors
    import tokenizers
    import torch
    import transformers

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
        "safetensors": safetensors.__version__,
    }


def qwen2_pipeline() -> tuple[dict, str]:
    """The Qwen2 tokenizer.json pipeline (NFC normalizer, the Qwen2 split regex,
    byte-level). When the default GGUF is present its pre-tokenizer regex, as
    transformers converts it, is checked to be the same."""
    src = "Qwen2 tokenizer.json pipeline (built in)"
    if DEFAULT_GGUF.is_file():
        from transformers import AutoTokenizer

        t = AutoTokenizer.from_pretrained(str(DEFAULT_GGUF.parent), gguf_file=DEFAULT_GGUF.name)
        j = json.loads(t.backend_tokenizer.to_str())
        split = j["pre_tokenizer"]["pretokenizers"][0]
        assert split["pattern"]["Regex"] == QWEN2_PRETOKENIZER_REGEX, split
        src += "; split regex checked equal to the default GGUF's"
    return QWEN2_PIPELINE, src


def build_tokenizer(pipeline: dict, extra_tokens: list[str]):
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    base = json.loads(tok.to_str())
    base.update(pipeline)
    tok = Tokenizer.from_str(json.dumps(base))
    trainer = trainers.BpeTrainer(
        vocab_size=BPE_VOCAB,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tok.train_from_iterator(CORPUS, trainer=trainer)
    assert tok.get_vocab_size() == BPE_VOCAB, tok.get_vocab_size()
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIALS])
    if extra_tokens:
        tok.add_tokens([AddedToken(s, special=False, normalized=False) for s in extra_tokens])
    # post-processor as in Qwen's tokenizer.json (affects offsets only)
    j = json.loads(tok.to_str())
    j["post_processor"] = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    return j


def tokenizer_config(tok_json: dict, template: str) -> dict:
    added = {}
    for t in tok_json["added_tokens"]:
        added[str(t["id"])] = {
            "content": t["content"], "lstrip": False, "normalized": False, "rstrip": False,
            "single_word": False, "special": t["special"],
        }
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": added,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "bos_token": None,
        "chat_template": template,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 512,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }


def init_weights(model, seed: int, spec: dict) -> None:
    """Seeded init: matrices N(0, 1/fan_in), the residual-branch outputs
    (o_proj, down_proj) and lm_head scaled up so the layers, not the token's
    own embedding, decide the next token (tied models otherwise repeat the
    last token), and logits are spread enough for a clear argmax."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            elif name.endswith(".bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            elif "embed_tokens" in name:
                p.copy_(spec["embed_std"] * torch.randn(p.shape, generator=g))
            elif p.dim() == 2:
                scale = 1.0 / math.sqrt(p.shape[1])
                if name.endswith(("o_proj.weight", "down_proj.weight")):
                    scale *= spec["resid_scale"]
                if name == "lm_head.weight":
                    scale *= spec["lm_head_scale"]
                p.copy_(scale * torch.randn(p.shape, generator=g))
            else:
                raise RuntimeError(f"unexpected parameter {name} {tuple(p.shape)}")


def f9(x: float) -> float:
    return float(f"{x:.9g}")


def rows(t) -> list:
    return [[f9(v) for v in r] for r in t.tolist()]


def make(name: str, spec: dict, out: Path, pipeline: dict, vers: dict, pipeline_src: str) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2Config, Qwen3Config
    from transformers import Qwen2ForCausalLM, Qwen3ForCausalLM

    d = out / name
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)

    tok_json = build_tokenizer(pipeline, spec["extra_tokens"])
    n_tok = max(t["id"] for t in tok_json["added_tokens"]) + 1
    vocab_size = spec["pad_vocab_to"] or n_tok
    assert vocab_size >= n_tok
    ids = {t["content"]: t["id"] for t in tok_json["added_tokens"]}

    common = dict(
        vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        rope_theta=1e6, rms_norm_eps=1e-6, tie_word_embeddings=spec["tie"],
        bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"],
        pad_token_id=ids["<|endoftext|>"], use_sliding_window=False, sliding_window=None,
        max_window_layers=2, hidden_act="silu",
    )
    if spec["arch"] == "qwen2":
        cfg = Qwen2Config(**common)
        model = Qwen2ForCausalLM(cfg)
    else:
        cfg = Qwen3Config(head_dim=spec["head_dim"], attention_bias=False, **common)
        model = Qwen3ForCausalLM(cfg)
    init_weights(model, SEED + (0 if spec["arch"] == "qwen2" else 1), spec)
    dtype = getattr(torch, spec["dtype"])
    model = model.to(dtype)
    model.save_pretrained(d, safe_serialization=True)
    for extra in d.glob("chat_template.jinja"):
        extra.unlink()

    # config.json in the classic layout real checkpoints ship (rope_theta and
    # torch_dtype at the top level), beside transformers' newer keys.
    cj = json.loads((d / "config.json").read_text())
    cj["rope_theta"] = 1e6
    cj["torch_dtype"] = spec["dtype"]
    cj["dtype"] = spec["dtype"]
    (d / "config.json").write_text(json.dumps(cj, indent=2, sort_keys=True) + "\n")

    template = (FIXTURES / spec["template"]).read_text(encoding="utf-8")
    (d / "tokenizer.json").write_text(json.dumps(tok_json, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    (d / "tokenizer_config.json").write_text(
        json.dumps(tokenizer_config(tok_json, template), ensure_ascii=False, indent=2) + "\n", encoding="utf-8"
    )

    # --- reference: reload from disk in f32, eager attention ---------------
    ref = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager")
    ref.eval()
    loaded = {k: v.to(torch.float32) for k, v in model.state_dict().items()}
    for k, v in ref.state_dict().items():
        assert torch.equal(v, loaded[k]), f"reloaded weight differs: {k}"

    htok = AutoTokenizer.from_pretrained(d)
    from tokenizers import Tokenizer

    rtok = Tokenizer.from_file(str(d / "tokenizer.json"))
    for s in CORPUS[:9] + ["<|im_start|>user\n  tabs\t\tand 12345 <|im_end|>", "<think>\nx\n</think>"]:
        a = htok.encode(s, add_special_tokens=False)
        b = rtok.encode(s, add_special_tokens=False).ids
        assert a == b, (s, a, b)
    def greedy_path(input_ids):
        # greedy by full recompute, ties to the lowest id (torch.argmax
        # returns the first maximal index)
        cur = list(input_ids)
        out, margin = [], float("inf")
        with torch.no_grad():
            for _ in range(GREEDY_TOKENS):
                lg = ref(input_ids=torch.tensor([cur])).logits[0, -1].to(torch.float32)
                top2 = torch.topk(lg, 2).values
                margin = min(margin, float(top2[0] - top2[1]))
                nxt = int(torch.argmax(lg))
                out.append(nxt)
                cur.append(nxt)
        return out, margin

    # Inputs are drawn (seeded) until the greedy path has a clear argmax at
    # every step (top1 - top2 >= MIN_MARGIN), so engines that sum in another
    # order still agree token for token.
    g = torch.Generator().manual_seed(SEED + 7)
    seqs = {}
    for n in SEQ_LENGTHS:
        best = None
        for _ in range(MAX_DRAWS):
            cand = torch.randint(0, n_tok, (n,), generator=g).tolist()
            path, margin = greedy_path(cand)
            if best is None or margin > best[2]:
                best = (cand, path, margin)
            if margin >= MIN_MARGIN:
                break
        seqs[f"random_len{n}"] = best
    best = None
    for question in CHAT_QUESTIONS:
        msgs = [{"role": "user", "content": question}]
        p = htok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        cand = htok.encode(p, add_special_tokens=False)
        path, margin = greedy_path(cand)
        if best is None or margin > best[2]:
            best = (cand, path, margin, p)
        if margin >= MIN_MARGIN:
            break
    prompt = best[3]
    seqs["chat_prompt"] = best[:3]

    cases = []
    with torch.no_grad():
        for cname, (input_ids, greedy, margin) in seqs.items():
            x = torch.tensor([input_ids])
            logits = ref(input_ids=x).logits[0].to(torch.float32)
            case = {"name": cname, "input_ids": input_ids, "last_logits": [f9(v) for v in logits[-1].tolist()]}
            if len(input_ids) == 7:
                case["all_logits"] = rows(logits)
            gen = ref.generate(
                x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=GREEDY_TOKENS,
                min_new_tokens=GREEDY_TOKENS, eos_token_id=None, pad_token_id=ids["<|endoftext|>"],
                use_cache=True,
            )[0, len(input_ids):].tolist()
            assert gen == greedy, f"{name}/{cname}: generate {gen} != recompute {greedy}"
            case["greedy"] = greedy
            case["greedy_min_margin"] = f9(margin)
            cases.append(case)

    meta = {
        "description": "transformers reference logits for this directory's weights; see "
                       "scripts/make_random_checkpoints.py for the format.",
        "versions": vers,
        "architecture": cj.get("architectures"),
        "weights_dtype": spec["dtype"],
        "compute_dtype": "float32",
        "attn_implementation": "eager",
        "seed": SEED,
        "min_margin_target": MIN_MARGIN,
        "vocab_size": vocab_size,
        "tokenizer_size": n_tok,
        "special_ids": {k: ids[k] for k in SPECIALS},
        "tokenizer_pipeline_source": pipeline_src,
        "chat_prompt": prompt,
    }
    (d / "logits.json").write_text(json.dumps({"meta": meta, "cases": cases}, indent=None) + "\n")
    size = sum(p.stat().st_size for p in d.iterdir())
    print(f"{name}: vocab {vocab_size} (tokenizer {n_tok}), {size} bytes, "
          f"min greedy margin {min(c['greedy_min_margin'] for c in cases):.4f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args()

    import torch

    torch.manual_seed(SEED)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    vers = versions()
    pipeline, src = qwen2_pipeline()
    for name, spec in TINY.items():
        make(name, spec, args.out, pipeline, vers, src)
    return 0


if __name__ == "__main__":
    sys.exit(main())
