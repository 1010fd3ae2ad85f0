"""Real clients against a running `statebench serve`.

Runs the official openai SDK and inspect_ai against the server and checks
what each client sees: chat, streaming, tools, sampling with seeds,
logprobs, structured output, embeddings, models, concurrency, client
disconnects, legacy completions, error objects and a whole inspect_ai eval.

    target/client-venv/bin/python tests/clients/serve_clients.py \
        --base-url http://127.0.0.1:PORT/v1 --model NAME --log-dir DIR

Prints `ok NAME` or `FAIL NAME: reason` per check and exits 1 when any
check failed. `.ci/run` builds the venv; tests/serve_clients.rs starts the
server and runs this script. Every request goes to the given base URL
(loopback in the test) with a bounded timeout and no retries.
"""

import argparse
import asyncio
import json
import math
import os
import socket
import sys
import time
import traceback
from urllib.parse import urlsplit

import openai
from openai import AsyncOpenAI, OpenAI

# Per-request timeout (seconds) of every SDK call. The server runs a 0.5B
# model on two CPU cores: a reply of up to 48 tokens takes a few seconds.
TIMEOUT = 60.0
# A prompt far longer than the model's context (32,768 tokens for the
# default model): about 40,000 tokens.
OVERFLOW_TEXT = "word " * 40000

ARGS = None
CLIENT = None
RESULTS = []  # (name, ok, reason)
_CACHE = {}


def say(text=""):
    print(text, flush=True)


CHECKS = []


def check(name):
    """Registers a check; `main` runs each in its own try/except, in order."""

    def wrap(fn):
        fn.check_name = name
        CHECKS.append(fn)
        return fn

    return wrap


class Fail(Exception):
    pass


def expect(cond, reason):
    if not cond:
        raise Fail(reason)


def short(value, limit=300):
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} chars)"


def tail(value, limit=400):
    """The end of a long message: inspect's errors hold the whole request
    first and the server's answer last, after a blank line."""
    text = value if isinstance(value, str) else repr(value)
    for sep in ("\n\n", "\\n\\n"):
        last = text.rsplit(sep, 1)[-1]
        if last.strip():
            text = last
    return text if len(text) <= limit else "..." + text[-limit:]


def describe_error(e):
    """One line for an exception: the SDK's status and error body when it has them."""
    if isinstance(e, openai.APIStatusError):
        return f"{type(e).__name__} (HTTP {e.status_code}): {short(e.body)}"
    if isinstance(e, openai.APIError):
        return f"{type(e).__name__}: {short(e.message)}"
    return f"{type(e).__name__}: {short(str(e))}"


def messages(text):
    return [{"role": "user", "content": text}]


def chat(**kw):
    kw.setdefault("model", ARGS.model)
    return CLIENT.chat.completions.create(**kw)


def extras(resp):
    """Top-level fields of a response that the SDK's model does not declare."""
    return dict(resp.model_extra or {})


def usage_filled(usage, where):
    expect(usage is not None, f"{where}: no usage")
    expect(
        isinstance(usage.prompt_tokens, int) and usage.prompt_tokens > 0,
        f"{where}: usage.prompt_tokens = {usage.prompt_tokens!r}",
    )
    expect(
        isinstance(usage.completion_tokens, int) and usage.completion_tokens > 0,
        f"{where}: usage.completion_tokens = {usage.completion_tokens!r}",
    )
    expect(
        usage.total_tokens == usage.prompt_tokens + usage.completion_tokens,
        f"{where}: usage.total_tokens {usage.total_tokens} != "
        f"{usage.prompt_tokens} + {usage.completion_tokens}",
    )


# --------------------------------------------------------------------------
# Chat

PLAIN = dict(
    messages=messages("Name three primary colors, separated by commas."),
    max_tokens=24,
    temperature=0,
)


def plain_reply():
    """The non-streaming temperature-0 reply to PLAIN (made once)."""
    if "plain" not in _CACHE:
        _CACHE["plain"] = chat(**PLAIN)
    return _CACHE["plain"]


@check("chat")
def check_chat():
    resp = plain_reply()
    expect(len(resp.choices) == 1, f"{len(resp.choices)} choices")
    choice = resp.choices[0]
    content = choice.message.content
    expect(isinstance(content, str) and content.strip(), f"content {content!r}")
    expect(choice.finish_reason in ("stop", "length"), f"finish_reason {choice.finish_reason!r}")
    expect(choice.message.role == "assistant", f"role {choice.message.role!r}")
    usage_filled(resp.usage, "reply")
    say(f"    reply: {content!r} ({choice.finish_reason}, {resp.usage.completion_tokens} tokens)")


@check("chat_stream")
def check_chat_stream():
    stream = chat(**PLAIN, stream=True, stream_options={"include_usage": True})
    pieces = []
    finish = None
    last = None
    chunks = 0
    sys.stdout.write("    stream: ")
    try:
        for chunk in stream:
            chunks += 1
            last = chunk
            for c in chunk.choices:
                if c.delta is not None and c.delta.content:
                    pieces.append(c.delta.content)
                    sys.stdout.write(c.delta.content)
                    sys.stdout.flush()
                if c.finish_reason is not None:
                    finish = c.finish_reason
    finally:
        say(f"  [{chunks} chunks]")
    text = "".join(pieces)
    expect(chunks > 0, "no chunks")
    expect(finish in ("stop", "length"), f"finish_reason seen: {finish!r}")
    expect(last.usage is not None, "the last chunk carries no usage")
    usage_filled(last.usage, "last chunk")
    expected = plain_reply().choices[0].message.content
    expect(text == expected, f"streamed {text!r} != non-streamed {expected!r}")


# --------------------------------------------------------------------------
# Tools

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "City name"}},
            "required": ["city"],
        },
    },
}
WEATHER_ASK = messages("What is the weather like in Paris right now?")


def weather_call(tool_choice):
    resp = chat(
        messages=WEATHER_ASK,
        tools=[WEATHER_TOOL],
        tool_choice=tool_choice,
        max_tokens=48,
        temperature=0,
    )
    choice = resp.choices[0]
    calls = choice.message.tool_calls
    expect(calls, f"no tool_calls (content {choice.message.content!r}, finish {choice.finish_reason!r})")
    call = calls[0]
    expect(call.type == "function", f"tool call type {call.type!r}")
    expect(call.function.name == "get_weather", f"tool name {call.function.name!r}")
    try:
        args = json.loads(call.function.arguments)
    except ValueError as e:
        raise Fail(f"arguments are not JSON ({e}): {call.function.arguments!r}")
    expect(
        isinstance(args, dict) and isinstance(args.get("city"), str),
        f"arguments lack a string city: {args!r}",
    )
    expect(choice.finish_reason == "tool_calls", f"finish_reason {choice.finish_reason!r}")
    expect(isinstance(call.id, str) and call.id, f"tool call id {call.id!r}")
    say(f"    {call.function.name}({call.function.arguments}) id={call.id}")
    return call.id


@check("tools_required")
def check_tools_required():
    _CACHE.setdefault("tool_ids", []).append(weather_call("required"))


@check("tools_named")
def check_tools_named():
    _CACHE.setdefault("tool_ids", []).append(
        weather_call({"type": "function", "function": {"name": "get_weather"}})
    )


@check("tools_none")
def check_tools_none():
    resp = chat(
        messages=WEATHER_ASK,
        tools=[WEATHER_TOOL],
        tool_choice="none",
        max_tokens=24,
        temperature=0,
    )
    choice = resp.choices[0]
    expect(not choice.message.tool_calls, f"tool_calls {choice.message.tool_calls!r}")
    expect(choice.finish_reason in ("stop", "length"), f"finish_reason {choice.finish_reason!r}")
    say(f"    reply: {choice.message.content!r}")


@check("tool_call_ids_unique")
def check_tool_ids_unique():
    ids = list(_CACHE.get("tool_ids", []))
    while len(ids) < 2:
        ids.append(weather_call("required"))
    expect(len(set(ids)) == len(ids), f"repeated ids {ids}")


@check("tools_stream")
def check_tools_stream():
    stream = chat(
        messages=WEATHER_ASK,
        tools=[WEATHER_TOOL],
        tool_choice="required",
        max_tokens=48,
        temperature=0,
        stream=True,
    )
    calls = {}
    finish = None
    for chunk in stream:
        for c in chunk.choices:
            for tc in (c.delta.tool_calls or []) if c.delta is not None else []:
                acc = calls.setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
                if tc.id:
                    acc["id"] = tc.id
                if tc.function is not None:
                    acc["name"] += tc.function.name or ""
                    acc["arguments"] += tc.function.arguments or ""
            if c.finish_reason is not None:
                finish = c.finish_reason
    expect(calls, f"no delta.tool_calls streamed (finish {finish!r})")
    for index, acc in sorted(calls.items()):
        say(f"    [{index}] {acc['name']}({acc['arguments']}) id={acc['id']}")
        expect(acc["id"], f"call {index} has no id")
        expect(acc["name"] == "get_weather", f"call {index} name {acc['name']!r}")
        try:
            args = json.loads(acc["arguments"])
        except ValueError as e:
            raise Fail(f"call {index} arguments are not JSON ({e}): {acc['arguments']!r}")
        expect(isinstance(args, dict) and isinstance(args.get("city"), str), f"arguments {args!r}")
    expect(finish == "tool_calls", f"finish_reason {finish!r}")


# --------------------------------------------------------------------------
# Sampling: n and seed

SAMPLED = dict(messages=messages("Write a four-word poem about rain."), max_tokens=16, temperature=1)


def response_seed(resp):
    seed = extras(resp).get("seed")
    if seed is None:
        seed = resp.to_dict().get("seed")
    return seed


@check("n_and_seed")
def check_n_and_seed():
    first = chat(**SAMPLED, n=2, seed=7)
    expect(len(first.choices) == 2, f"{len(first.choices)} choices")
    expect([c.index for c in first.choices] == [0, 1], f"indexes {[c.index for c in first.choices]}")
    texts = [c.message.content for c in first.choices]
    for t in texts:
        say(f"    {t!r}")
    again = chat(**SAMPLED, n=2, seed=7)
    texts2 = [c.message.content for c in sorted(again.choices, key=lambda c: c.index)]
    expect(texts2 == texts, f"same seed, different texts: {texts} then {texts2}")
    seed = response_seed(first)
    expect(seed == 7, f"response seed {seed!r} (top-level fields: {sorted(extras(first))})")


@check("seed_returned")
def check_seed_returned():
    first = chat(**SAMPLED)
    seed = response_seed(first)
    expect(
        isinstance(seed, int) and not isinstance(seed, bool),
        f"no seed in a seedless temperature-1 reply (top-level fields: {sorted(extras(first))})",
    )
    again = chat(**SAMPLED, seed=seed)
    a, b = first.choices[0].message.content, again.choices[0].message.content
    say(f"    seed {seed}: {a!r}")
    expect(a == b, f"seed {seed} did not reproduce: {a!r} then {b!r}")


# --------------------------------------------------------------------------
# Logprobs


@check("logprobs")
def check_logprobs():
    resp = chat(
        messages=messages("Count from one to twenty in words."),
        max_tokens=12,
        temperature=0,
        logprobs=True,
        top_logprobs=3,
    )
    choice = resp.choices[0]
    expect(choice.logprobs is not None, "choices[0].logprobs is null")
    entries = choice.logprobs.content
    expect(entries, f"logprobs.content {entries!r}")
    n_tokens = resp.usage.completion_tokens
    if choice.finish_reason == "length":
        expect(len(entries) == n_tokens, f"{len(entries)} entries for {n_tokens} tokens")
    else:
        # A stop token may be counted in usage without being content.
        expect(len(entries) in (n_tokens, n_tokens - 1), f"{len(entries)} entries for {n_tokens} tokens")
    raw = b""
    for i, e in enumerate(entries):
        expect(isinstance(e.token, str), f"entry {i}: token {e.token!r}")
        expect(isinstance(e.logprob, float | int) and e.logprob <= 0, f"entry {i}: logprob {e.logprob!r}")
        expect(
            isinstance(e.bytes, list) and all(isinstance(b, int) and 0 <= b < 256 for b in e.bytes),
            f"entry {i}: bytes {e.bytes!r}",
        )
        raw += bytes(e.bytes)
        top = e.top_logprobs
        expect(len(top) == 3, f"entry {i}: {len(top)} top_logprobs")
        lps = [t.logprob for t in top]
        expect(lps == sorted(lps, reverse=True), f"entry {i}: top_logprobs not descending {lps}")
        expect(top[0].token == e.token, f"entry {i}: chosen {e.token!r} is not the first top entry {top[0].token!r}")
        expect(math.isclose(top[0].logprob, e.logprob, abs_tol=1e-5), f"entry {i}: logprob differs from top[0]")
    expect(
        raw.decode("utf-8", errors="replace") == choice.message.content,
        f"token bytes {raw!r} != content {choice.message.content!r}",
    )
    say("    " + " ".join(f"{e.token!r}:{e.logprob:.3f}" for e in entries))


# --------------------------------------------------------------------------
# Structured output


def parse_object(content, what):
    expect(isinstance(content, str), f"content {content!r}")
    expect(not content.lstrip().startswith("```"), f"Markdown fence in {content!r}")
    try:
        value = json.loads(content)
    except ValueError as e:
        raise Fail(f"{what} is not JSON ({e}): {content!r}")
    expect(isinstance(value, dict), f"{what} is not an object: {value!r}")
    return value


@check("json_object")
def check_json_object():
    resp = chat(
        messages=messages('Reply with a JSON object with a key "color" naming one color.'),
        response_format={"type": "json_object"},
        max_tokens=48,
        temperature=0,
    )
    content = resp.choices[0].message.content
    say(f"    {content!r}")
    parse_object(content, "content")


PERSON_SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


@check("json_schema")
def check_json_schema():
    resp = chat(
        messages=messages("Describe Ann, who is 31 years old, as JSON."),
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "person", "schema": PERSON_SCHEMA},
        },
        max_tokens=48,
        temperature=0,
    )
    content = resp.choices[0].message.content
    say(f"    {content!r}")
    value = parse_object(content, "content")
    expect(set(value) == {"name", "age"}, f"keys {sorted(value)}")
    expect(isinstance(value["name"], str), f"name {value['name']!r}")
    expect(isinstance(value["age"], int) and not isinstance(value["age"], bool), f"age {value['age']!r}")
    try:
        import jsonschema  # present as a dependency of inspect_ai
    except ImportError:
        return
    jsonschema.validate(value, PERSON_SCHEMA)


# --------------------------------------------------------------------------
# Embeddings and models


@check("embeddings")
def check_embeddings():
    # The SDK's defaults: it asks for base64 and decodes it.
    raw = CLIENT.embeddings.with_raw_response.create(model=ARGS.model, input=["a", "b"])
    wire = json.loads(raw.text)
    kinds = [type(d.get("embedding")).__name__ for d in wire.get("data", [])]
    expect(kinds == ["str", "str"], f"asked for base64, got embeddings of types {kinds}")
    resp = raw.parse()
    data = resp.data
    expect(len(data) == 2, f"{len(data)} vectors")
    expect([d.index for d in data] == [0, 1], f"indexes {[d.index for d in data]}")
    dims = [len(d.embedding) for d in data]
    expect(dims[0] > 0 and dims[0] == dims[1], f"dimensions {dims}")
    for d in data:
        expect(all(isinstance(x, float) for x in d.embedding), f"vector {d.index} is not floats")
        norm = math.sqrt(sum(x * x for x in d.embedding))
        expect(abs(norm - 1) <= 1e-3, f"vector {d.index} has norm {norm}")
    expect(data[0].embedding != data[1].embedding, "the two inputs got the same vector")
    say(f"    2 vectors of {dims[0]} dimensions")


@check("models_list")
def check_models_list():
    ids = [m.id for m in CLIENT.models.list()]
    expect(ARGS.model in ids, f"{ARGS.model!r} not in {ids}")


@check("models_retrieve")
def check_models_retrieve():
    m = CLIENT.models.retrieve(ARGS.model)
    expect(m.id == ARGS.model, f"id {m.id!r}")
    expect(m.object == "model", f"object {m.object!r}")


@check("models_retrieve_unknown")
def check_models_unknown():
    try:
        m = CLIENT.models.retrieve("no-such-model")
    except openai.NotFoundError:
        return
    raise Fail(f"an unknown model id was found: {m!r}")


# --------------------------------------------------------------------------
# Concurrency and disconnects

CONCURRENT_PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Name a prime number above 50.",
    "What does HTTP stand for?",
    "Translate 'good morning' into Spanish.",
    "List two sorting algorithms.",
    "What colour is the sky on a clear day?",
    "Give one word that rhymes with cat.",
]


@check("concurrent_8")
def check_concurrent():
    kw = lambda p: dict(model=ARGS.model, messages=messages(p), max_tokens=16, temperature=0)  # noqa: E731
    alone = [CLIENT.chat.completions.create(**kw(p)).choices[0].message.content for p in CONCURRENT_PROMPTS]

    async def together():
        client = AsyncOpenAI(base_url=ARGS.base_url, api_key="statebench", timeout=TIMEOUT, max_retries=0)
        try:
            return await asyncio.gather(
                *(client.chat.completions.create(**kw(p)) for p in CONCURRENT_PROMPTS),
                return_exceptions=True,
            )
        finally:
            await client.close()

    t0 = time.monotonic()
    results = asyncio.run(together())
    wall = time.monotonic() - t0
    errors = [f"#{i}: {describe_error(r)}" for i, r in enumerate(results) if isinstance(r, BaseException)]
    expect(not errors, "; ".join(errors))
    for i, r in enumerate(results):
        got = r.choices[0].message.content
        expect(got == alone[i], f"#{i} {CONCURRENT_PROMPTS[i]!r}: together {got!r} != alone {alone[i]!r}")
    say(f"    8 requests together in {wall:.1f} s")


def normal_request_within(limit, what):
    t0 = time.monotonic()
    resp = chat(messages=messages("Say hello."), max_tokens=8, temperature=0, timeout=limit)
    wall = time.monotonic() - t0
    expect(resp.choices[0].message.content, f"{what}: empty reply")
    expect(wall < limit, f"{what}: answered after {wall:.1f} s")
    return wall


@check("stream_disconnect")
def check_stream_disconnect():
    stream = chat(
        messages=messages("Write a long story about a lighthouse keeper."),
        max_tokens=48,
        temperature=0,
        stream=True,
    )
    first = None
    try:
        for chunk in stream:
            first = chunk
            break
    finally:
        stream.close()
    expect(first is not None, "the stream ended before its first chunk")
    wall = normal_request_within(60.0, "after a disconnect")
    say(f"    next request answered in {wall:.1f} s")


def raw_post(path, body):
    """Opens a socket, sends one POST and returns the socket unread."""
    parts = urlsplit(ARGS.base_url)
    host, port = parts.hostname, parts.port or 80
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    # A small receive window, so an unread stream backs up into the server.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
    sock.settimeout(TIMEOUT)
    sock.connect((host, port))
    payload = json.dumps(body).encode()
    head = (
        f"POST {parts.path.rstrip('/')}{path} HTTP/1.1\r\n"
        f"Host: {host}:{port}\r\n"
        "Content-Type: application/json\r\n"
        "Authorization: Bearer statebench\r\n"
        f"Content-Length: {len(payload)}\r\n"
        "\r\n"
    ).encode()
    sock.sendall(head + payload)
    return sock


@check("unread_stream")
def check_unread_stream():
    sock = raw_post(
        "/chat/completions",
        {
            "model": ARGS.model,
            "messages": messages("Write a long story about a lighthouse keeper."),
            "max_tokens": 48,
            "temperature": 0,
            "stream": True,
        },
    )
    try:
        time.sleep(0.5)
        wall = normal_request_within(60.0, "while a stream is unread")
        say(f"    answered in {wall:.1f} s while another client read nothing")
    finally:
        sock.close()


# --------------------------------------------------------------------------
# Legacy completions

COMPLETION = dict(prompt="def add(a, b):", max_tokens=16, temperature=0, stop=["\n\n"])


@check("completions")
def check_completions():
    resp = CLIENT.completions.create(model=ARGS.model, logprobs=2, **COMPLETION)
    choice = resp.choices[0]
    say(f"    {COMPLETION['prompt']!r} -> {choice.text!r} ({choice.finish_reason})")
    expect(isinstance(choice.text, str) and choice.text, f"text {choice.text!r}")
    expect(choice.finish_reason in ("stop", "length"), f"finish_reason {choice.finish_reason!r}")
    lp = choice.logprobs
    expect(lp is not None, "logprobs is null")
    expect(lp.tokens, f"logprobs.tokens {lp.tokens!r}")
    expect(
        lp.token_logprobs is not None and len(lp.token_logprobs) == len(lp.tokens),
        f"{len(lp.token_logprobs or [])} token_logprobs for {len(lp.tokens)} tokens",
    )
    expect(
        lp.top_logprobs is not None and len(lp.top_logprobs) == len(lp.tokens),
        f"{len(lp.top_logprobs or [])} top_logprobs for {len(lp.tokens)} tokens",
    )
    for i, (tok, tlp, top) in enumerate(zip(lp.tokens, lp.token_logprobs, lp.top_logprobs)):
        expect(isinstance(tlp, float | int) and tlp <= 0, f"token {i}: logprob {tlp!r}")
        expect(isinstance(top, dict) and 1 <= len(top) <= 2, f"token {i}: top_logprobs {top!r}")
    # The tokens spell the text, and at most the stop sequence after it.
    spelled = "".join(lp.tokens)
    expect(
        spelled == choice.text or (spelled.startswith(choice.text) and spelled[len(choice.text) :].startswith("\n\n")),
        f"tokens {lp.tokens!r} do not spell the text {choice.text!r}",
    )
    usage_filled(resp.usage, "completion")
    _CACHE["completion_text"] = choice.text


@check("completions_echo")
def check_completions_echo():
    plain = _CACHE.get("completion_text")
    if plain is None:
        plain = CLIENT.completions.create(model=ARGS.model, **COMPLETION).choices[0].text
    resp = CLIENT.completions.create(model=ARGS.model, echo=True, **COMPLETION)
    text = resp.choices[0].text
    want = COMPLETION["prompt"] + plain
    expect(text == want, f"echo gave {text!r}, want {want!r}")


# --------------------------------------------------------------------------
# Errors


def bad_request(call, param, code=None):
    try:
        resp = call()
    except openai.BadRequestError as e:
        body = e.body
        expect(isinstance(body, dict), f"error body {body!r}")
        missing = [k for k in ("message", "type", "param", "code") if k not in body]
        expect(not missing, f"error object lacks {missing}: {body!r}")
        expect(isinstance(body["message"], str) and body["message"], f"message {body['message']!r}")
        expect(e.param == param, f"param {e.param!r}, want {param!r}: {body!r}")
        if code is not None:
            expect(e.code == code, f"code {e.code!r}, want {code!r}: {body!r}")
        say(f"    400 {body['message']}")
        return
    except openai.APIStatusError as e:
        raise Fail(f"HTTP {e.status_code}, want 400: {short(e.body)}")
    raise Fail(f"accepted: {short(json.dumps(resp.to_dict()) if hasattr(resp, 'to_dict') else resp)}")


@check("bad_n")
def check_bad_n():
    bad_request(lambda: chat(messages=messages("hi"), max_tokens=8, n=100), "n")


@check("bad_top_logprobs")
def check_bad_top_logprobs():
    bad_request(
        lambda: chat(messages=messages("hi"), max_tokens=8, logprobs=True, top_logprobs=21),
        "top_logprobs",
    )


@check("bad_json_schema")
def check_bad_schema():
    bad_request(
        lambda: chat(
            messages=messages("hi"),
            max_tokens=8,
            response_format={"type": "json_schema", "json_schema": {"name": "bad", "schema": {"type": 12}}},
        ),
        "response_format",
    )


@check("context_length_exceeded")
def check_context_overflow():
    bad_request(
        lambda: chat(messages=messages(OVERFLOW_TEXT), max_tokens=8),
        "messages",
        code="context_length_exceeded",
    )


# --------------------------------------------------------------------------
# inspect_ai

INSPECT_SAMPLES = [
    ("What is 2 + 2? Answer with the number only.", "4"),
    ("What is the capital of France? Answer with one word.", "Paris"),
    ("What color is grass? Answer with one word.", "green"),
    ("How many legs does a spider have? Answer with the number only.", "8"),
    ("Which planet do we live on? Answer with one word.", "Earth"),
]


def inspect_env():
    # inspect's `openai-api/<service>/<model>` reads <SERVICE>_BASE_URL and
    # <SERVICE>_API_KEY.
    os.environ["STATEBENCH_BASE_URL"] = ARGS.base_url
    os.environ["STATEBENCH_API_KEY"] = "statebench"


def inspect_run(name, samples):
    from inspect_ai import Task, eval as inspect_eval
    from inspect_ai.dataset import Sample
    from inspect_ai.scorer import includes
    from inspect_ai.solver import generate

    inspect_env()
    task = Task(
        name=name,
        dataset=[Sample(input=q, target=t, id=i + 1) for i, (q, t) in enumerate(samples)],
        solver=generate(),
        scorer=includes(),
    )
    logs = inspect_eval(
        task,
        model=f"openai-api/statebench/{ARGS.model}",
        log_dir=ARGS.log_dir,
        max_tokens=16,
        temperature=0,
        max_retries=0,
        timeout=int(TIMEOUT),
        fail_on_error=True,
        display="none",
        log_level="warning",
    )
    expect(len(logs) == 1, f"{len(logs)} logs")
    return logs[0]


def sample_output(sample):
    """(completion, stop_reason) of a logged sample; (None, None) when it has no output."""
    out = sample.output
    if out is None or not out.choices:
        return None, None
    return out.completion, out.stop_reason


def inspect_summary(log):
    say(f"    log: {log.location}")
    say(f"    status: {log.status}")
    if log.error is not None:
        say(f"    error: {tail(log.error.message)}")
    if log.results is not None:
        say(f"    samples: {log.results.completed_samples}/{log.results.total_samples}")
        for score in log.results.scores:
            metrics = ", ".join(f"{k}={v.value:.3f}" for k, v in score.metrics.items())
            say(f"    score {score.name}: {metrics}")
    for model, usage in (log.stats.model_usage or {}).items():
        say(
            f"    usage {model}: input {usage.input_tokens}, output {usage.output_tokens}, "
            f"total {usage.total_tokens}"
        )
    for s in log.samples or []:
        completion, stop = sample_output(s)
        scores = {k: v.value for k, v in (s.scores or {}).items()}
        err = f" error={tail(s.error.message, 200)}" if s.error is not None else ""
        shown = repr(short(completion, 120)) if completion is not None else "(no output)"
        say(f"    sample {s.id}: {shown} stop={stop} scores={scores}{err}")


@check("inspect_eval")
def check_inspect_eval():
    log = inspect_run("statebench_serve_clients", INSPECT_SAMPLES)
    inspect_summary(log)
    expect(log.status == "success", f"eval status {log.status!r}: {tail(log.error.message) if log.error else ''}")
    samples = log.samples or []
    expect(len(samples) == len(INSPECT_SAMPLES), f"{len(samples)} samples in the log")
    for s in samples:
        expect(s.error is None, f"sample {s.id} error: {tail(s.error.message) if s.error else ''}")
        expect(sample_output(s)[0], f"sample {s.id}: no completion")
        expect(s.scores, f"sample {s.id}: not scored")
    expect(log.stats.model_usage, "no token usage recorded")


@check("inspect_context_overflow")
def check_inspect_overflow():
    log = inspect_run("statebench_serve_overflow", [(OVERFLOW_TEXT, "x")])
    inspect_summary(log)
    expect(log.status != "error", f"eval status {log.status!r}: {tail(log.error.message) if log.error else ''}")
    samples = log.samples or []
    expect(len(samples) == 1, f"{len(samples)} samples in the log")
    stop = sample_output(samples[0])[1]
    expect(stop == "model_length", f"stop_reason {stop!r}")


# --------------------------------------------------------------------------


def main():
    global ARGS, CLIENT
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-url", required=True, help="e.g. http://127.0.0.1:8080/v1")
    parser.add_argument("--model", required=True, help="the model id the server lists")
    parser.add_argument("--log-dir", required=True, help="where inspect_ai writes its logs")
    parser.add_argument("--only", action="append", help="run only the named checks (repeatable)")
    ARGS = parser.parse_args()
    ARGS.base_url = ARGS.base_url.rstrip("/")
    CLIENT = OpenAI(base_url=ARGS.base_url, api_key="statebench", timeout=TIMEOUT, max_retries=0)
    say(f"openai {openai.__version__}, server {ARGS.base_url}, model {ARGS.model!r}")

    start = time.monotonic()
    for fn in CHECKS:
        name = fn.check_name
        if ARGS.only and name not in ARGS.only:
            continue
        t0 = time.monotonic()
        try:
            fn()
        except Fail as e:
            RESULTS.append((name, False, str(e)))
        except Exception as e:  # noqa: BLE001 - every failure is reported, none stops the run
            RESULTS.append((name, False, describe_error(e)))
            if not isinstance(e, openai.APIError):
                traceback.print_exc(limit=4, file=sys.stdout)
        else:
            RESULTS.append((name, True, ""))
        name, ok, reason = RESULTS[-1]
        took = time.monotonic() - t0
        say(f"ok {name} ({took:.1f} s)" if ok else f"FAIL {name}: {reason} ({took:.1f} s)")

    failed = [r for r in RESULTS if not r[1]]
    say()
    say(f"serve clients: {len(RESULTS) - len(failed)} ok, {len(failed)} FAIL, {time.monotonic() - start:.0f} s")
    for name, _, reason in failed:
        say(f"FAIL {name}: {reason}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
