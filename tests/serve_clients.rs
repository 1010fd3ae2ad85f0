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

    let mut child = Command::new(&python)
        .arg(&script)
        .args(["--base-url", &base_url, "--model", &name, "--log-dir"])
        .arg(logs.path())
        .env("PYTHONUNBUFFERED", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{} does not run: {e}", python.display()));
    let lines = Arc::new(Mutex::new(Vec::new()));
    let readers = [
        forward(child.stdout.take().unwrap(), "", lines.clone()),
        forward(child.stderr.take().unwrap(), "", lines.clone()),
    ];
    let mut client = Killed(child);

    let deadline = Instant::now() + SCRIPT_LIMIT;
    let status = loop {
        if let Some(s) = client.0.try_wait().expect("wait on the client script") {
            break s;
        }
        if Instant::now() > deadline {
            drop(client);
            panic!("the client script ran past {SCRIPT_LIMIT:?}");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    for r in readers {
        let _ = r.join();
    }
    // The script repeats its failures after its summary line; list those.
    let lines = lines.lock().unwrap();
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
