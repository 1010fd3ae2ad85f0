#!/usr/bin/env python3
"""Write the tokenizer and chat-template reference fixtures.

Outputs, in tests/fixtures/engine/:

  tokenizer_cases.json         {"meta": {...}, "cases": [{"text", "ids", "tokens"}]}
                               ids from the Hugging Face transformers tokenizer
                               built from the default GGUF (gguf_file=...), with
                               special tokens in the text parsed as special tokens
                               and no BOS/EOS added.
  vocab_info.json              special token ids and GGUF tokenizer metadata.
  qwen2.5_chat_template.jinja  tokenizer.chat_template from the GGUF, verbatim.
  qwen3_chat_template.jinja    the official Qwen3 (hybrid thinking) template,
                               verbatim (the string stored in QWEN3_CHAT_TEMPLATE
                               below).
  chat_template_cases.json     {"meta": {...}, "cases": [{"template", "messages",
                               "add_generation_prompt", "enable_thinking",
                               "rendered", "ids"?}]}, rendered by transformers'
                               apply_chat_template(tokenize=False).

usage: python3 scripts/make_reference_fixtures.py [--gguf PATH] [--out DIR]

Needs: transformers, tokenizers, gguf, jinja2, torch (transformers' GGUF reader
imports it). The default GGUF comes from models/fetch.sh.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_GGUF = ROOT / "models" / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
DEFAULT_OUT = ROOT / "tests" / "fixtures" / "engine"

# The official Qwen3 chat template (hybrid thinking models, e.g. Qwen3-0.6B):
# the "chat_template" string of their tokenizer_config.json, verbatim.
QWEN3_CHAT_TEMPLATE = (
    "{%- if tools %}\n"
    "    {{- '<|im_start|>system\\n' }}\n"
    "    {%- if messages[0].role == 'system' %}\n"
    "        {{- messages[0].content + '\\n\\n' }}\n"
    "    {%- endif %}\n"
    "    {{- \"# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>\" }}\n"
    "    {%- for tool in tools %}\n"
    "        {{- \"\\n\" }}\n"
    "        {{- tool | tojson }}\n"
    "    {%- endfor %}\n"
    "    {{- \"\\n</tools>\\n\\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\\"name\\\": <function-name>, "
    "\\\"arguments\\\": <args-json-object>}\\n</tool_call><|im_end|>\\n\" }}\n"
    "{%- else %}\n"
    "    {%- if messages[0].role == 'system' %}\n"
    "        {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}\n"
    "    {%- endif %}\n"
    "{%- endif %}\n"
    "{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}\n"
    "{%- for message in messages[::-1] %}\n"
    "    {%- set index = (messages|length - 1) - loop.index0 %}\n"
    "    {%- if ns.multi_step_tool and message.role == \"user\" and not(message.content.startswith('<tool_response>') "
    "and message.content.endswith('</tool_response>')) %}\n"
    "        {%- set ns.multi_step_tool = false %}\n"
    "        {%- set ns.last_query_index = index %}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- for message in messages %}\n"
    "    {%- if (message.role == \"user\") or (message.role == \"system\" and not loop.first) %}\n"
    "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n"
    "    {%- elif message.role == \"assistant\" %}\n"
    "        {%- set content = message.content %}\n"
    "        {%- set reasoning_content = '' %}\n"
    "        {%- if message.reasoning_content is defined and message.reasoning_content is not none %}\n"
    "            {%- set reasoning_content = message.reasoning_content %}\n"
    "        {%- else %}\n"
    "            {%- if '</think>' in message.content %}\n"
    "                {%- set content = message.content.split('</think>')[-1].lstrip('\\n') %}\n"
    "                {%- set reasoning_content = message.content.split('</think>')[0].rstrip('\\n')"
    ".split('<think>')[-1].lstrip('\\n') %}\n"
    "            {%- endif %}\n"
    "        {%- endif %}\n"
    "        {%- if loop.index0 > ns.last_query_index %}\n"
    "            {%- if loop.last or (not loop.last and reasoning_content) %}\n"
    "                {{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content.strip('\\n') + "
    "'\\n</think>\\n\\n' + content.lstrip('\\n') }}\n"
    "            {%- else %}\n"
    "                {{- '<|im_start|>' + message.role + '\\n' + content }}\n"
    "            {%- endif %}\n"
    "        {%- else %}\n"
    "            {{- '<|im_start|>' + message.role + '\\n' + content }}\n"
    "        {%- endif %}\n"
    "        {%- if message.tool_calls %}\n"
    "            {%- for tool_call in message.tool_calls %}\n"
    "                {%- if (loop.first and content) or (not loop.first) %}\n"
    "                    {{- '\\n' }}\n"
    "                {%- endif %}\n"
    "                {%- if tool_call.function %}\n"
    "                    {%- set tool_call = tool_call.function %}\n"
    "                {%- endif %}\n"
    "                {{- '<tool_call>\\n{\"name\": \"' }}\n"
    "                {{- tool_call.name }}\n"
    "                {{- '\", \"arguments\": ' }}\n"
    "                {%- if tool_call.arguments is string %}\n"
    "                    {{- tool_call.arguments }}\n"
    "                {%- else %}\n"
    "                    {{- tool_call.arguments | tojson }}\n"
    "                {%- endif %}\n"
    "                {{- '}\\n</tool_call>' }}\n"
    "            {%- endfor %}\n"
    "        {%- endif %}\n"
    "        {{- '<|im_end|>\\n' }}\n"
    "    {%- elif message.role == \"tool\" %}\n"
    "        {%- if loop.first or (messages[loop.index0 - 1].role != \"tool\") %}\n"
    "            {{- '<|im_start|>user' }}\n"
    "        {%- endif %}\n"
    "        {{- '\\n<tool_response>\\n' }}\n"
    "        {{- message.content }}\n"
    "        {{- '\\n</tool_response>' }}\n"
    "        {%- if loop.last or (messages[loop.index0 + 1].role != \"tool\") %}\n"
    "            {{- '<|im_end|>\\n' }}\n"
    "        {%- endif %}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|im_start|>assistant\\n' }}\n"
    "    {%- if enable_thinking is defined and enable_thinking is false %}\n"
    "        {{- '<think>\\n\\n</think>\\n\\n' }}\n"
    "    {%- endif %}\n"
    "{%- endif %}"
)
# sha256 of the UTF-8 template above (4116 characters, LF line ends, no final newline).
QWEN3_CHAT_TEMPLATE_SHA256 = "87a2728cb8dc9fe424d624542f6060ec05a1d285ebbec578bb078900e33396b5"

RUST_SNIPPET = """fn main() {
    let xs: Vec<u32> = (0..10).map(|x| x * x).collect();
    for (i, x) in xs.iter().enumerate() {
        println!("{i}: {x:>4}");
    }
}
"""

PY_SNIPPET = """def fib(n: int) -> int:
\tif n < 2:
\t\treturn n
\treturn fib(n - 1) + fib(n - 2)


if __name__ == "__main__":
    print([fib(i) for i in range(10)])  # 0 1 1 2 ...
"""

TOKENIZER_TEXTS = [
    # plain
    "",
    "Hello, world!",
    "What is the capital of France?",
    "The capital of France is Paris.",
    " leading space",
    "trailing space ",
    "UPPER lower MiXeD CamelCase snake_case kebab-case",
    "don't can't won't it's we're they've I'd",
    # unicode
    "你好，世界！今天天气怎么样？",
    "日本語のテキストとカタカナ、ひらがな。",
    "한국어 문장입니다.",
    "Ünïcödé àccénts: café, naïve, façade, Ångström, Œuvre",
    "Emoji: 😀🚀🔥 👨‍👩‍👧‍👦 🇫🇷 ✔️",
    "Math: ∑ᵢ xᵢ² ≤ ∞, α+β=γ, √2 ≈ 1.41421356",
    "Mixed 中文 and English and 123 数字",
    "\u00a0non-breaking\u2009thin\u200bzero-width",
    # decomposed (NFD) accents: the GGUF tokenizer applies no NFC normalization
    # (transformers' GGUF conversion and llama.cpp alike), whereas Qwen's
    # tokenizer.json has an NFC normalizer.
    "cafe\u0301 nai\u0308ve A\u030angstro\u0308m",
    # code
    RUST_SNIPPET,
    PY_SNIPPET,
    "    indented four\n        indented eight\n\t\ttabbed twice",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name;",
    "{\"key\": [1, 2.5, -3e10, null, true], \"nested\": {\"a\": \"b\"}}",
    "#include <stdio.h>\nint main(void) { return printf(\"%d\\n\", 42); }",
    # digits
    "1234567890",
    "3.14159265358979323846264338327950288419716939937510",
    "RC-4808/#W1941",
    "Order #00042 shipped 2024-11-30T10:15:00Z for $1,234.56 (x3)",
    "v1.2.3-rc.4+build.5678",
    # whitespace runs
    "a  b   c    d     e",
    "tabs\tand\t\ttabs\t\t\there",
    "line1\nline2\n\nline4\n\n\n\nline8",
    "windows\r\nline\r\nends",
    "trailing spaces   ",
    "   ",
    "\n",
    "\n\n\n",
    " \t \n \t\n",
    "mixed \t whitespace \n\t \n end",
    # special tokens inside text
    "<|im_start|>user\nHi<|im_end|>",
    "before<|im_end|>after<|im_start|>",
    "<|endoftext|>",
    "text <|endoftext|> more text",
    "<|im_start|>assistant\n<tool_call>\n{\"name\": \"f\"}\n</tool_call><|im_end|>",
    "<|fim_prefix|>def f(<|fim_suffix|>):\n    pass<|fim_middle|>",
    "not special: <|im_start |> <im_end> |im_start|",
]

SYSTEM_QWEN25_DEFAULT = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."

CONVERSATIONS = {
    "single_user": [
        {"role": "user", "content": "What is the capital of France?"},
    ],
    "with_system": [
        {"role": "system", "content": "You are a terse assistant. Answer in one word."},
        {"role": "user", "content": "What is the capital of France?"},
    ],
    "multi_turn": [
        {"role": "system", "content": "You are a helpful coding assistant."},
        {"role": "user", "content": "Write a Rust function that adds two numbers."},
        {"role": "assistant", "content": "```rust\nfn add(a: i32, b: i32) -> i32 {\n    a + b\n}\n```"},
        {"role": "user", "content": "Now make it generic."},
    ],
    "multi_turn_no_system": [
        {"role": "user", "content": "Hi!"},
        {"role": "assistant", "content": "Hello! How can I help you today?"},
        {"role": "user", "content": "Tell me a joke."},
        {"role": "assistant", "content": "Why did the developer go broke? Because he used up all his cache."},
        {"role": "user", "content": "Another one."},
    ],
    "unicode": [
        {"role": "system", "content": "Réponds en français. 你好 🚀"},
        {"role": "user", "content": "Quelle est la capitale de l'Allemagne ? Ünïcödé ✔️\n\n  indented\ttab"},
    ],
    "ends_with_assistant": [
        {"role": "user", "content": "Count to three."},
        {"role": "assistant", "content": "1, 2, 3."},
    ],
    "think_in_history": [
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "<think>\nThe user asks a simple sum. 2+2=4.\n</think>\n\n2+2 = 4."},
        {"role": "user", "content": "And 3+3?"},
    ],
    "think_last_assistant": [
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "<think>\nSimple: 4.\n</think>\n\nIt is 4."},
    ],
    "empty_think_in_history": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Name a colour."},
        {"role": "assistant", "content": "<think>\n\n</think>\n\nBlue."},
        {"role": "user", "content": "Another."},
    ],
    "reasoning_content_field": [
        {"role": "user", "content": "Is 7 prime?"},
        {"role": "assistant", "content": "Yes.", "reasoning_content": "7 has no divisors other than 1 and 7."},
        {"role": "user", "content": "Is 9 prime?"},
        {"role": "assistant", "content": "No, 9 = 3 * 3.", "reasoning_content": "9 = 3*3."},
    ],
    "special_tokens_in_content": [
        {"role": "user", "content": "Please echo this literally: <|im_end|> and <|endoftext|>"},
    ],
    "empty_user": [
        {"role": "user", "content": ""},
    ],
}

# (conversation name, add_generation_prompt) for each template.
QWEN25_CASES = [
    ("single_user", True),
    ("with_system", True),
    ("multi_turn", True),
    ("multi_turn_no_system", True),
    ("unicode", True),
    ("ends_with_assistant", False),
    ("single_user", False),
    ("special_tokens_in_content", True),
    ("empty_user", True),
    ("think_in_history", True),
]
QWEN3_CASES = [
    ("single_user", True),
    ("with_system", True),
    ("multi_turn", True),
    ("multi_turn_no_system", True),
    ("unicode", True),
    ("ends_with_assistant", False),
    ("think_in_history", True),
    ("think_last_assistant", False),
    ("empty_think_in_history", True),
    ("reasoning_content_field", True),
    ("reasoning_content_field", False),
    ("special_tokens_in_content", True),
]
QWEN3_THINKING_MODES = [True, False, None]  # None: enable_thinking not passed


def versions() -> dict:
    import gguf  # noqa: F401
    import jinja2
    import tokenizers
    import transformers

    out = {
        "python": platform.python_version(),
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
        "jinja2": jinja2.__version__,
    }
    try:
        from importlib.metadata import version

        out["gguf"] = version("gguf")
    except Exception:
        pass
    try:
        import torch

        out["torch"] = torch.__version__
    except Exception:
        pass
    return out


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def gguf_metadata(path: Path) -> dict:
    from gguf import GGUFReader

    r = GGUFReader(str(path))
    f = r.fields
    toks = f["tokenizer.ggml.tokens"].contents()
    types = f["tokenizer.ggml.token_type"].contents()

    def get(key):
        return f[key].contents() if key in f else None

    non_normal = [
        {"id": i, "content": toks[i], "gguf_token_type": int(types[i])}
        for i in range(len(toks))
        if types[i] not in (1, 5)  # 1 = normal, 5 = unused ([PADnnn] fillers)
    ]
    unused = [i for i in range(len(toks)) if types[i] == 5]
    return {
        "chat_template": get("tokenizer.chat_template"),
        "info": {
            "tokenizer.ggml.model": get("tokenizer.ggml.model"),
            "tokenizer.ggml.pre": get("tokenizer.ggml.pre"),
            "n_tokens": len(toks),
            "n_merges": len(f["tokenizer.ggml.merges"].data),
            "bos_token_id": get("tokenizer.ggml.bos_token_id"),
            "eos_token_id": get("tokenizer.ggml.eos_token_id"),
            "padding_token_id": get("tokenizer.ggml.padding_token_id"),
            "add_bos_token": get("tokenizer.ggml.add_bos_token"),
            "non_normal_tokens": non_normal,
            "unused_token_ids": {"count": len(unused), "first": unused[0] if unused else None,
                                 "last": unused[-1] if unused else None},
        },
    }


def write_json(path: Path, obj) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False, indent=1)
        f.write("\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gguf", type=Path, default=DEFAULT_GGUF)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args()
    if not args.gguf.is_file():
        print(f"make_reference_fixtures: GGUF not found: {args.gguf} (run models/fetch.sh)", file=sys.stderr)
        return 1
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)

    assert hashlib.sha256(QWEN3_CHAT_TEMPLATE.encode()).hexdigest() == QWEN3_CHAT_TEMPLATE_SHA256

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(args.gguf.parent), gguf_file=args.gguf.name)
    meta_gguf = gguf_metadata(args.gguf)
    vers = versions()
    source = {
        "gguf_file": args.gguf.name,
        "gguf_sha256": sha256_file(args.gguf),
        "tokenizer": "transformers AutoTokenizer.from_pretrained(models_dir, gguf_file=...)",
        "tokenizer_class": type(tok).__name__,
    }

    # (a) tokenizer cases ------------------------------------------------------
    rendered_prompts = []
    for name in ("single_user", "with_system", "multi_turn", "unicode", "think_in_history"):
        rendered_prompts.append(
            tok.apply_chat_template(CONVERSATIONS[name], tokenize=False, add_generation_prompt=True)
        )
    rendered_prompts.append(
        tok.apply_chat_template(CONVERSATIONS["ends_with_assistant"], tokenize=False, add_generation_prompt=False)
    )
    cases = []
    for text in TOKENIZER_TEXTS + rendered_prompts:
        ids = tok.encode(text, add_special_tokens=False)
        tokens = tok.convert_ids_to_tokens(ids)
        decoded = tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        if decoded != text:
            print(f"warning: decode(encode(text)) != text for {text!r}: {decoded!r}", file=sys.stderr)
        cases.append({"text": text, "ids": ids, "tokens": tokens})
    write_json(out / "tokenizer_cases.json", {
        "meta": {
            "description": "Reference token ids for the default GGUF's tokenizer. ids = encode(text) "
                           "with no BOS/EOS added; special tokens written in the text are matched as "
                           "special tokens. tokens are the byte-level BPE token strings, for debugging.",
            "versions": vers,
            "source": source,
        },
        "cases": cases,
    })

    # vocab info ---------------------------------------------------------------
    def tid(s):
        i = tok.convert_tokens_to_ids(s)
        return None if i is None or i == tok.unk_token_id else i

    added = []
    for i, t in sorted(tok.added_tokens_decoder.items()):
        added.append({"id": i, "content": t.content, "special": t.special})
    info = meta_gguf["info"]
    write_json(out / "vocab_info.json", {
        "meta": {"versions": vers, "source": source},
        "special_ids": {
            "im_start": tid("<|im_start|>"),
            "im_end": tid("<|im_end|>"),
            "endoftext": tid("<|endoftext|>"),
        },
        "gguf": {k: v for k, v in info.items()},
        "transformers": {
            "vocab_len": len(tok),
            "bos_token": tok.bos_token, "bos_token_id": tok.bos_token_id,
            "eos_token": tok.eos_token, "eos_token_id": tok.eos_token_id,
            "pad_token": tok.pad_token, "pad_token_id": tok.pad_token_id,
            "added_tokens": added,
        },
        "stop_token_ids": sorted({tid("<|im_end|>"), tid("<|endoftext|>")}),
    })

    # (b) chat templates ------------------------------------------------------
    q25 = meta_gguf["chat_template"]
    assert q25 == tok.chat_template, "GGUF chat template differs from the tokenizer's"
    (out / "qwen2.5_chat_template.jinja").write_text(q25, encoding="utf-8", newline="")
    (out / "qwen3_chat_template.jinja").write_text(QWEN3_CHAT_TEMPLATE, encoding="utf-8", newline="")

    tcases = []
    for name, agp in QWEN25_CASES:
        msgs = CONVERSATIONS[name]
        rendered = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=agp)
        tcases.append({
            "name": name, "template": "qwen2.5", "messages": msgs, "add_generation_prompt": agp,
            "enable_thinking": None, "rendered": rendered,
            "ids": tok.encode(rendered, add_special_tokens=False),
        })
    for name, agp in QWEN3_CASES:
        msgs = CONVERSATIONS[name]
        for et in QWEN3_THINKING_MODES:
            kw = {} if et is None else {"enable_thinking": et}
            rendered = tok.apply_chat_template(
                msgs, chat_template=QWEN3_CHAT_TEMPLATE, tokenize=False, add_generation_prompt=agp, **kw
            )
            tcases.append({
                "name": name, "template": "qwen3", "messages": msgs, "add_generation_prompt": agp,
                "enable_thinking": et, "rendered": rendered,
            })
    write_json(out / "chat_template_cases.json", {
        "meta": {
            "description": "Chat templates rendered by transformers apply_chat_template(messages, "
                           "tokenize=False, add_generation_prompt=..., [enable_thinking=...]). "
                           "template: 'qwen2.5' = qwen2.5_chat_template.jinja (from the GGUF), "
                           "'qwen3' = qwen3_chat_template.jinja. enable_thinking null = not passed "
                           "(template default, thinking on). ids (qwen2.5 only) = the default GGUF "
                           "tokenizer's encoding of rendered. transformers renders with jinja2 "
                           "trim_blocks=True, lstrip_blocks=True.",
            "versions": vers,
            "source": source,
            "qwen3_template_sha256": QWEN3_CHAT_TEMPLATE_SHA256,
            "qwen2.5_default_system": SYSTEM_QWEN25_DEFAULT,
        },
        "cases": tcases,
    })
    print(f"wrote {len(cases)} tokenizer cases and {len(tcases)} chat template cases to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
