//! `statebench serve` against real clients: the official openai SDK and
//! inspect_ai, driven by tests/clients/serve_clients.py from the venv that
//! `.ci/run` builds (target/client-venv). The server runs the default model
//! on loopback and is killed when the test ends, pass or fail; the script
//! and the server's start are both bounded in time.

mod engine_common;

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_statebench");

/// How long the server may take to load the model and report its address.
const START_LIMIT: Duration = Duration::from_secs(180);
/// How long the whole client script may run (it takes a few minutes on two
/// CPU cores).
const SCRIPT_LIMIT: Duration = Duration::from_secs(900);

/// A child process killed (and reaped) when dropped, so that a failing
/// assertion never leaves a server or a client behind.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Writes a line to the real stderr: not captured by the test harness, so
/// the clients' output shows in CI logs even when the test passes.
fn show(prefix: &str, line: &str) {
    let _ = writeln!(std::io::stderr(), "{prefix}{line}");
}

/// Forwards `r` line by line to stderr under `prefix`; returns every line.
fn forward(
    r: impl Read + Send + 'static,
    prefix: &'static str,
    lines: Arc<Mutex<Vec<String>>>,
) -> JoinHandle<()> {
    std::thread::spawn(move || {
        for line in BufReader::new(r).lines() {
            let Ok(line) = line else { break };
            show(prefix, &line);
            lines.lock().unwrap().push(line);
        }
    })
}

/// The model name and address in the server's start line,
/// `statebench serve: NAME on http://ADDR (...)`.
fn parse_start_line(line: &str) -> Option<(String, String)> {
    let rest = line.strip_prefix("statebench serve: ")?;
    let at = rest.find(" on http://")?;
    let name = rest[..at].to_string();
    let addr = rest[at + " on http://".len()..]
        .split_whitespace()
        .next()?
        .to_string();
    Some((name, addr))
}

/// A `statebench serve` on a free loopback port: the child, the model's
/// name and `host:port`. Its stderr is forwarded to the test's stderr.
fn start_server(model: &Path) -> (Killed, String, String) {
    let mut child = Command::new(BIN)
        .args(["serve", "--host", "127.0.0.1", "--port", "0", "--model"])
        .arg(model)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("serve starts");
    let stderr = child.stderr.take().expect("piped stderr");
    let child = Killed(child);
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            show("serve: ", &line);
            // After the start line nobody listens; keep draining so the
            // server never blocks on a full pipe.
            let _ = tx.send(line);
        }
    });
    let deadline = Instant::now() + START_LIMIT;
    let mut seen = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => {
                if let Some((name, addr)) = parse_start_line(&line) {
                    return (child, name, addr);
                }
                seen.push(line);
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                panic!("serve did not report its address within {START_LIMIT:?}: {seen:?}")
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                panic!("serve exited before reporting its address: {seen:?}")
            }
        }
    }
}

/// Runs a client to its end within `limit`, its output forwarded to
/// stderr; its exit status and every line it wrote.
fn run_bounded(mut cmd: Command, limit: Duration) -> (std::process::ExitStatus, Vec<String>) {
    let program = cmd.get_program().to_string_lossy().into_owned();
    let mut child = cmd
        .env("PYTHONUNBUFFERED", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{program} does not run: {e}"));
    let lines = Arc::new(Mutex::new(Vec::new()));
    let readers = [
        forward(child.stdout.take().unwrap(), "", lines.clone()),
        forward(child.stderr.take().unwrap(), "", lines.clone()),
    ];
    let mut client = Killed(child);
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(s) = client.0.try_wait().expect("wait on the client") {
            break s;
        }
        if Instant::now() > deadline {
            drop(client);
            panic!("{program} ran past {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    for r in readers {
        let _ = r.join();
    }
    let lines = std::mem::take(&mut *lines.lock().unwrap());
    (status, lines)
}

/// The client venv's python, or `None` (failed in CI, skipped elsewhere)
/// when `.ci/run` has not built it.
fn client_python() -> Option<PathBuf> {
    let python = engine_common::root().join("target/client-venv/bin/python");
    if python.is_file() {
        return Some(python);
    }
    engine_common::missing(&format!(
        "the client venv is missing ({} not found; .ci/run creates it with openai and inspect-ai)",
        python.display()
    ));
    None
}

#[test]
#[cfg_attr(
    not(has_default_model),
    ignore = "needs the default model: run models/fetch.sh"
)]
fn openai_sdk_and_inspect_ai_against_serve() {
    let Some(python) = client_python() else {
        return;
    };
    let gguf = engine_common::default_model();
    let script = engine_common::root().join("tests/clients/serve_clients.py");
    assert!(script.is_file(), "{} is missing", script.display());
    let logs = tempfile::tempdir().unwrap();

    let (_server, name, addr) = start_server(&gguf);
    let base_url = format!("http://{addr}/v1");
    show("", &format!("serve_clients: {name} at {base_url}"));

    let mut cmd = Command::new(&python);
    cmd.arg(&script)
        .args(["--base-url", &base_url, "--model", &name, "--log-dir"])
        .arg(logs.path());
    let (status, lines) = run_bounded(cmd, SCRIPT_LIMIT);
    // The script repeats its failures after its summary line; list those.
    let summary = lines
        .iter()
        .rposition(|l| l.starts_with("serve clients: "))
        .unwrap_or(0);
    let failures: Vec<&str> = lines[summary..]
        .iter()
        .filter(|l| l.starts_with("FAIL "))
        .map(String::as_str)
        .collect();
    assert!(
        status.success(),
        "the client script failed ({status}):\n{}",
        failures.join("\n")
    );
}

#[test]
fn start_line_parses() {
    assert_eq!(
        parse_start_line(
            "statebench serve: Qwen2.5 Coder 0.5B Instruct AWQ on http://127.0.0.1:34255 (POST /v1/chat/completions, GET /v1/models)"
        ),
        Some((
            "Qwen2.5 Coder 0.5B Instruct AWQ".to_string(),
            "127.0.0.1:34255".to_string()
        ))
    );
    assert_eq!(parse_start_line("loading model"), None);
}

/// lm-eval-harness's venv (`.ci/run` builds it), or `None` (failed in CI,
/// skipped elsewhere).
fn lm_eval_bin() -> Option<PathBuf> {
    let bin = engine_common::root().join("target/lmeval-venv/bin/lm_eval");
    if bin.is_file() {
        return Some(bin);
    }
    engine_common::missing(&format!(
        "lm-eval is missing ({} not found; .ci/run creates its venv)",
        bin.display()
    ));
    None
}

/// Questions a small instruct model answers, with four choices each.
const MC: &[(&str, [&str; 4], usize)] = &[
    (
        "What is the capital of France?",
        ["Berlin", "Paris", "Madrid", "Rome"],
        1,
    ),
    (
        "How many legs does a spider have?",
        ["six", "four", "eight", "ten"],
        2,
    ),
    (
        "What color is the sky on a clear day?",
        ["blue", "green", "red", "black"],
        0,
    ),
    (
        "Which planet do we live on?",
        ["Mars", "Venus", "Jupiter", "Earth"],
        3,
    ),
    ("What is 2 + 2?", ["3", "4", "5", "22"], 1),
    ("Which animal says meow?", ["dog", "cow", "cat", "duck"], 2),
    ("What do bees make?", ["honey", "milk", "silk", "wool"], 0),
    (
        "What is frozen water called?",
        ["steam", "sand", "glass", "ice"],
        3,
    ),
];

/// Questions for generate_until, answered in a word.
const GEN: &[(&str, &str)] = &[
    ("What is the capital of Italy?", "Rome"),
    ("What is the opposite of hot?", "cold"),
    ("How many days are in a week?", "seven"),
];

/// The multiple_choice task's prompt, as its YAML writes it.
fn mc_context(q: &str) -> String {
    format!("Question: {q}\nAnswer:")
}

/// Writes the two tasks (local JSON data, no hub) under `dir`.
fn write_tasks(dir: &Path) {
    let mc: String = MC
        .iter()
        .map(|(q, c, a)| {
            format!(
                "{}\n",
                serde_json::json!({"question": q, "choices": c, "answer": a})
            )
        })
        .collect();
    let gen: String = GEN
        .iter()
        .map(|(q, a)| format!("{}\n", serde_json::json!({"question": q, "answer": a})))
        .collect();
    std::fs::write(dir.join("mc.jsonl"), mc).unwrap();
    std::fs::write(dir.join("gen.jsonl"), gen).unwrap();
    let data = |f: &str| dir.join(f).display().to_string();
    std::fs::write(
        dir.join("statebench_mc.yaml"),
        format!(
            "task: statebench_mc\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {}\ntest_split: test\noutput_type: multiple_choice\ndoc_to_text: \"Question: {{{{question}}}}\\nAnswer:\"\ndoc_to_choice: \"{{{{choices}}}}\"\ndoc_to_target: answer\nmetric_list:\n  - metric: acc\n",
            data("mc.jsonl")
        ),
    )
    .unwrap();
    std::fs::write(
        dir.join("statebench_gen.yaml"),
        format!(
            "task: statebench_gen\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {}\ntest_split: test\noutput_type: generate_until\ndoc_to_text: \"Answer in one word. {{{{question}}}}\"\ndoc_to_target: answer\ngeneration_kwargs:\n  until: [\"\\n\", \".\"]\n  max_gen_toks: 8\n  do_sample: false\n  temperature: 0\nmetric_list:\n  - metric: exact_match\n    ignore_case: true\n    ignore_punctuation: true\n",
            data("gen.jsonl")
        ),
    )
    .unwrap();
}

/// Runs lm_eval once; returns its results file and its samples of `task`.
fn lm_eval(
    bin: &Path,
    tasks: &Path,
    out: &Path,
    task: &str,
    model: &str,
    args: &str,
    chat: bool,
) -> (Value, Vec<Value>) {
    let mut cmd = Command::new(bin);
    cmd.args([
        "--model",
        model,
        "--model_args",
        args,
        "--tasks",
        task,
        "--include_path",
    ])
    .arg(tasks)
    .args(["--batch_size", "1", "--log_samples", "--output_path"])
    .arg(out)
    // Nothing from the hub: local data, an exported tokenizer.
    .env("HF_HUB_OFFLINE", "1")
    .env("HF_DATASETS_OFFLINE", "1")
    .env("TRANSFORMERS_OFFLINE", "1")
    .env("HF_HOME", out.join("hf-home"));
    if chat {
        cmd.arg("--apply_chat_template");
    }
    let (status, lines) = run_bounded(cmd, SCRIPT_LIMIT);
    assert!(
        status.success(),
        "lm_eval {task} ({args}) failed ({status}):\n{}",
        lines[lines.len().saturating_sub(30)..].join("\n")
    );
    let mut results = None;
    let mut samples = Vec::new();
    for f in walk(out) {
        let name = f.file_name().unwrap().to_string_lossy().into_owned();
        if name.starts_with("results_") && name.ends_with(".json") {
            results = Some(serde_json::from_str(&std::fs::read_to_string(&f).unwrap()).unwrap());
        } else if name.starts_with(&format!("samples_{task}_")) {
            samples = std::fs::read_to_string(&f)
                .unwrap()
                .lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect();
        }
    }
    (results.expect("lm_eval wrote its results"), samples)
}

/// Every file under `dir`.
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// Each document's choice log-likelihoods scored in-process from the
/// engine's prompt log-probabilities, split as lm-eval splits context and
/// continuation (the context's tokens, then the rest of the whole's).
fn in_process_scores(engine: &mut statebench::engine::Engine) -> Vec<Vec<f64>> {
    use statebench::backend::{Backend, ChatRequest};
    MC.iter()
        .map(|(q, choices, _)| {
            let context = mc_context(q);
            let ctx = engine.encode(&context).unwrap();
            choices
                .iter()
                .map(|c| {
                    let whole = engine.encode(&format!("{context} {c}")).unwrap();
                    let req = ChatRequest {
                        prompt_ids: Some(whole.clone()),
                        prompt_logprobs: Some(1),
                        ..ChatRequest::greedy(Vec::new(), 0)
                    };
                    let s = engine.open_session();
                    let r = engine.chat(s, req).unwrap();
                    engine.close_session(s);
                    r.prompt[ctx.len()..]
                        .iter()
                        .map(|t| f64::from(t.logprob.unwrap()))
                        .sum()
                })
                .collect()
        })
        .collect()
}

/// The index of the largest score, the first of ties (numpy's argmax, as lm-eval takes it).
fn argmax(v: &[f64]) -> usize {
    let mut best = 0;
    for (i, x) in v.iter().enumerate() {
        if *x > v[best] {
            best = i;
        }
    }
    best
}

#[test]
#[cfg_attr(
    not(has_default_model),
    ignore = "needs the default model: run models/fetch.sh"
)]
fn lm_eval_harness_against_serve() {
    let Some(bin) = lm_eval_bin() else {
        return;
    };
    let gguf = engine_common::default_model();
    let tmp = tempfile::tempdir().unwrap();
    let tasks = tmp.path().join("tasks");
    std::fs::create_dir_all(&tasks).unwrap();
    write_tasks(&tasks);
    let tok = tmp.path().join("tokenizer");
    let out = Command::new(BIN)
        .args(["model", "tokenizer", "--model"])
        .arg(&gguf)
        .arg("--out")
        .arg(&tok)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let (_server, name, addr) = start_server(&gguf);
    let completions = |tokenized: bool| {
        format!(
            "model={name},base_url=http://{addr}/v1/completions,tokenizer_backend=huggingface,tokenizer={},tokenized_requests={},num_concurrent=1,max_retries=1",
            tok.display(),
            if tokenized { "True" } else { "False" }
        )
    };
    let acc = |r: &Value| {
        r["results"]["statebench_mc"]["acc,none"]
            .as_f64()
            .expect("acc")
    };

    let mut engine = engine_common::load(&gguf);
    let want = in_process_scores(&mut engine);
    let want_acc = MC
        .iter()
        .zip(&want)
        .filter(|((_, _, a), s)| argmax(s) == *a)
        .count() as f64
        / MC.len() as f64;
    show(
        "",
        &format!("lm_eval: in-process multiple_choice accuracy {want_acc}"),
    );
    for tokenized in [true, false] {
        let dir = tmp.path().join(format!("mc-{tokenized}"));
        let (r, samples) = lm_eval(
            &bin,
            &tasks,
            &dir,
            "statebench_mc",
            "local-completions",
            &completions(tokenized),
            false,
        );
        assert_eq!(acc(&r), want_acc, "tokenized_requests={tokenized}: {r}");
        assert_eq!(samples.len(), MC.len());
        for s in &samples {
            let doc = s["doc_id"].as_u64().unwrap() as usize;
            // Each choice's log-likelihood: lm-eval's sum of the served
            // token log-probabilities, the engine's sum of its own.
            for (c, resp) in s["filtered_resps"].as_array().unwrap().iter().enumerate() {
                // Written as [log-likelihood, is-greedy], numbers as strings.
                let got = resp[0]
                    .as_f64()
                    .or_else(|| resp[0].as_str().and_then(|t| t.parse().ok()))
                    .unwrap_or_else(|| panic!("doc {doc}: {resp}"));
                assert!(
                    (got - want[doc][c]).abs() < 1e-5,
                    "doc {doc} choice {c}: {got} vs {}",
                    want[doc][c]
                );
            }
        }
    }
    // generate_until through completions: the replies the engine gives the same prompts.
    let dir = tmp.path().join("gen-completions");
    let (_, samples) = lm_eval(
        &bin,
        &tasks,
        &dir,
        "statebench_gen",
        "local-completions",
        &completions(true),
        false,
    );
    assert_eq!(samples.len(), GEN.len());
    for s in &samples {
        let doc = s["doc_id"].as_u64().unwrap() as usize;
        let req = statebench::backend::ChatRequest {
            prompt_text: Some(format!("Answer in one word. {}", GEN[doc].0)),
            stop: vec!["\n".into(), ".".into()],
            ..statebench::backend::ChatRequest::greedy(Vec::new(), 8)
        };
        let reply = engine_common::run_alone(&mut engine, req);
        assert_eq!(
            s["resps"][0][0].as_str().unwrap(),
            reply.content,
            "doc {doc}"
        );
    }
    // And through chat completions with the model's chat template.
    let dir = tmp.path().join("gen-chat");
    let chat = format!(
        "model={name},base_url=http://{addr}/v1/chat/completions,tokenizer_backend=huggingface,tokenizer={},num_concurrent=1,max_retries=1",
        tok.display()
    );
    let (r, samples) = lm_eval(
        &bin,
        &tasks,
        &dir,
        "statebench_gen",
        "local-chat-completions",
        &chat,
        true,
    );
    assert_eq!(samples.len(), GEN.len());
    let em = r["results"]["statebench_gen"]["exact_match,none"]
        .as_f64()
        .expect("exact_match");
    show(
        "",
        &format!("lm_eval: generate_until exact_match through chat {em}"),
    );
}
