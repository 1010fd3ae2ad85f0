//! Helpers shared by the engine tests.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use statebench::backend::{Backend, ChatReply, ChatRequest, Message, Role, SessionId};
use statebench::engine::device::Device;
use statebench::engine::model::BatchItem;
use statebench::engine::{Engine, EngineOptions, DEFAULT_MODEL};

/// The repository root: where the tests were built, or `STATEBENCH_ROOT`
/// when a test binary runs on another machine (`scripts/gpu-check.sh`).
pub fn root() -> PathBuf {
    std::env::var_os("STATEBENCH_ROOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")))
}

/// The default GGUF, fetched with `models/fetch.sh` when missing. A test
/// calling it is ignored where the build found no model (the
/// `has_default_model` cfg of `build.rs`), so one that runs fails without it.
pub fn default_model() -> PathBuf {
    let path = root().join(DEFAULT_MODEL);
    if !path.is_file() {
        let status = Command::new("bash")
            .arg(root().join("models/fetch.sh"))
            .status();
        assert!(
            path.is_file(),
            "the default model {} is absent and could not be fetched ({status:?})",
            path.display()
        );
    }
    path
}

/// Something a test needs is not installed: in CI (`CI` or
/// `STATEBENCH_REQUIRE` set) the test fails, since `.ci/run` installs
/// everything; elsewhere it is skipped, visibly.
pub fn missing(why: &str) {
    if ["CI", "STATEBENCH_REQUIRE"]
        .iter()
        .any(|v| std::env::var_os(v).is_some_and(|x| !x.is_empty()))
    {
        panic!("{why}; .ci/run installs it before the tests");
    }
    skip(why);
}

/// Reports a skipped test on the terminal: written to stderr directly, so
/// the test harness does not swallow it as it does a passing test's output.
pub fn skip(why: &str) {
    use std::io::Write;
    let name = std::thread::current().name().unwrap_or("test").to_string();
    let _ = writeln!(std::io::stderr(), "SKIPPED {name}: {why}");
}

/// Loads an engine with two threads.
pub fn load(spec: &Path) -> Engine {
    Engine::load(&spec.to_string_lossy(), EngineOptions::default()).expect("model loads")
}

/// A one-message user request.
pub fn ask(text: &str, max_tokens: usize) -> ChatRequest {
    ChatRequest::greedy(vec![Message::new(Role::User, text)], max_tokens)
}

/// Runs one request alone on a fresh session.
pub fn run_alone<D: Device>(engine: &mut Engine<D>, req: ChatRequest) -> ChatReply {
    let s = engine.open_session();
    let r = engine.chat(s, req).expect("chat");
    engine.close_session(s);
    r
}

/// Runs `target` together with `others` in one batch; returns the target's reply.
pub fn run_batched<D: Device>(
    engine: &mut Engine<D>,
    target: ChatRequest,
    others: &[ChatRequest],
) -> ChatReply {
    let mut sessions: Vec<SessionId> = Vec::new();
    let mut ids = Vec::new();
    // Put the target in the middle of the batch so it is neither first nor last.
    let mid = others.len() / 2;
    let mut all: Vec<ChatRequest> = others.to_vec();
    all.insert(mid, target);
    for r in all {
        let s = engine.open_session();
        ids.push(engine.submit(s, r).expect("submit"));
        sessions.push(s);
    }
    let want = ids[mid];
    let mut reply = None;
    while engine.has_pending() {
        for (id, r) in engine.step().expect("step") {
            if id == want {
                reply = Some(r.expect("reply"));
            }
        }
    }
    for s in sessions {
        engine.close_session(s);
    }
    reply.expect("target finished")
}

/// Last-token logits of a cold prefill of `tokens`.
pub fn cold_logits<D: Device>(engine: &Engine<D>, tokens: &[u32]) -> Vec<f32> {
    let mut cache = D::Cache::default();
    engine
        .forward(&mut [BatchItem {
            tokens,
            cache: &mut cache,
        }])
        .expect("forward")
        .remove(0)
}

/// Greedy continuation by incremental decoding; returns tokens and each step's logits.
pub fn greedy_incremental<D: Device>(
    engine: &Engine<D>,
    prompt: &[u32],
    n: usize,
) -> (Vec<u32>, Vec<Vec<f32>>) {
    let mut cache = D::Cache::default();
    let mut logits = engine
        .forward(&mut [BatchItem {
            tokens: prompt,
            cache: &mut cache,
        }])
        .expect("forward")
        .remove(0);
    let mut toks = Vec::new();
    let mut all = vec![logits.clone()];
    for _ in 0..n {
        let t = statebench::engine::sampling::argmax(&logits);
        toks.push(t);
        logits = engine
            .forward(&mut [BatchItem {
                tokens: &[t],
                cache: &mut cache,
            }])
            .expect("forward")
            .remove(0);
        all.push(logits.clone());
    }
    (toks, all)
}

/// Largest absolute difference between two logit vectors.
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// (a) KV-cached incremental decoding equals full recompute, bit for bit.
pub fn check_incremental_equals_recompute<D: Device>(engine: &Engine<D>, prompt: &[u32], n: usize) {
    let (toks, inc) = greedy_incremental(engine, prompt, n);
    for i in 0..=n {
        let mut seq = prompt.to_vec();
        seq.extend_from_slice(&toks[..i]);
        let full = cold_logits(engine, &seq);
        assert_eq!(
            inc[i],
            full,
            "step {i}: incremental vs recompute differ (max abs diff {}); tolerance is 0 (bit-identical)",
            max_abs_diff(&inc[i], &full)
        );
    }
}

/// (c) a prompt prefilled in two parts (cache + rest) equals a cold prefill, bit for bit.
pub fn check_split_prefill<D: Device>(engine: &Engine<D>, prompt: &[u32], splits: &[usize]) {
    let cold = cold_logits(engine, prompt);
    for &s in splits {
        assert!(s > 0 && s < prompt.len());
        let mut cache = D::Cache::default();
        engine
            .forward(&mut [BatchItem {
                tokens: &prompt[..s],
                cache: &mut cache,
            }])
            .expect("forward");
        let warm = engine
            .forward(&mut [BatchItem {
                tokens: &prompt[s..],
                cache: &mut cache,
            }])
            .expect("forward")
            .remove(0);
        assert_eq!(
            warm,
            cold,
            "split at {s}: cached-prefix logits differ from cold (max abs diff {})",
            max_abs_diff(&warm, &cold)
        );
    }
}

/// (b) a request's tokens are identical alone and in ragged batches of 2, 4 and 16.
pub fn check_batch_invariance<D: Device>(
    engine: &mut Engine<D>,
    target: ChatRequest,
    others: &[ChatRequest],
) {
    let alone = run_alone(engine, target.clone());
    for b in [2usize, 4, 16] {
        let batched = run_batched(engine, target.clone(), &others[..b - 1]);
        assert_eq!(
            batched.tokens, alone.tokens,
            "batch of {b}: tokens differ from the request alone"
        );
        assert_eq!(batched.content, alone.content);
    }
}

/// A copy of a tiny fixture with a longer context.
pub fn tiny_copy(dir: &Path, name: &str, context: u64) -> PathBuf {
    let src = root().join("tests/fixtures/engine").join(name);
    let dst = dir.join(format!("{name}-{context}"));
    std::fs::create_dir_all(&dst).unwrap();
    for e in std::fs::read_dir(&src).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), dst.join(e.file_name())).unwrap();
    }
    let cfg = dst.join("config.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&cfg).unwrap()).unwrap();
    v["max_position_embeddings"] = context.into();
    std::fs::write(&cfg, v.to_string()).unwrap();
    dst
}

/// The tiny random-weight Qwen2 fixture with a context long enough for
/// whole ladder episodes: early turns generate, later ones overflow
/// (random weights never stop early), so both paths run.
pub fn tiny_model_long(dir: &Path) -> PathBuf {
    tiny_copy(dir, "tiny-qwen2", 4096)
}

/// A run directory's episode records without the fields that measure time.
pub fn stable_records(dir: &Path) -> Vec<String> {
    let mut v = statebench::ladder::run::runlog::read_run(dir)
        .unwrap()
        .episodes;
    v.sort_by_key(|r| (r.seed, r.arm));
    v.into_iter()
        .map(|mut r| {
            r.wall_s = 0.0;
            r.usage.prefill_secs = 0.0;
            r.usage.decode_secs = 0.0;
            serde_json::to_string(&r).unwrap()
        })
        .collect()
}

/// A copy of a tiny fixture whose matrices (2-D tensors) are rounded to
/// bf16 and stored as bf16, its vectors (norms, biases) kept f32: what a
/// bf16 device holds, for a CPU engine to hold the same.
pub fn tiny_bf16_copy(dir: &Path, name: &str) -> PathBuf {
    use safetensors::{tensor::TensorView, Dtype, SafeTensors};
    use statebench::engine::device::f32_to_bf16;
    let dst = tiny_copy(dir, name, 512);
    let file = dst.join("model.safetensors");
    let bytes = std::fs::read(&file).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut owned: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = Vec::new();
    for (tensor, view) in st.tensors() {
        let shape = view.shape().to_vec();
        if view.dtype() == Dtype::F32 && shape.len() == 2 {
            let data: Vec<u8> = view
                .data()
                .chunks_exact(4)
                .flat_map(|b| {
                    f32_to_bf16(f32::from_le_bytes([b[0], b[1], b[2], b[3]])).to_le_bytes()
                })
                .collect();
            owned.push((tensor, Dtype::BF16, shape, data));
        } else {
            owned.push((tensor, view.dtype(), shape, view.data().to_vec()));
        }
    }
    let views: Vec<(String, TensorView)> = owned
        .iter()
        .map(|(n, d, s, b)| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    safetensors::serialize_to_file(views, None, &file).unwrap();
    dst
}

/// Fails the test unless the CUDA emulator was built with this statebench
/// (Linux, a C++ compiler at build time). A test calling it is ignored
/// where it was not (the `has_cuda_emulator` cfg of `build.rs`).
pub fn require_emulator() {
    if let Err(why) = statebench_kernels::cuda::emulator_dir() {
        panic!("{why}");
    }
}

fn drain(r: Option<impl Read + Send + 'static>) -> JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        if let Some(mut r) = r {
            let _ = r.read_to_end(&mut buf);
        }
        buf
    })
}

/// Runs the binary with a time limit; a run past it is killed and fails the test.
pub fn statebench_within(args: &[&str], limit: Duration) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_statebench"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("binary runs");
    let out = drain(child.stdout.take());
    let err = drain(child.stderr.take());
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait on child") {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{args:?} ran past {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    Output {
        status,
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
    }
}

/// Runs the binary (ten minutes at most).
pub fn statebench(args: &[&str]) -> Output {
    statebench_within(args, Duration::from_secs(600))
}

/// Fails with a one-line message holding `needle` (no panic); returns it.
pub fn refused(args: &[&str], needle: &str) -> String {
    let o = statebench(args);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(!o.status.success(), "{args:?} was accepted");
    assert!(err.contains(needle), "{args:?}: {err}");
    assert!(!err.contains("panicked"), "{args:?}: {err}");
    assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
    err
}

/// Rewrites one f32 tensor of a safetensors file in place.
pub fn edit_tensor(file: &Path, name: &str, edit: impl Fn(&mut [f32])) {
    let bytes = std::fs::read(file).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut owned: Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)> = st
        .tensors()
        .into_iter()
        .map(|(n, v)| (n, v.dtype(), v.shape().to_vec(), v.data().to_vec()))
        .collect();
    let t = owned.iter_mut().find(|t| t.0 == name).expect("tensor");
    assert_eq!(t.1, safetensors::Dtype::F32);
    let mut vals: Vec<f32> =
        t.3.chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
    edit(&mut vals);
    t.3 = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = owned
        .iter()
        .map(|(n, d, s, b)| {
            (
                n.clone(),
                safetensors::tensor::TensorView::new(*d, s.clone(), b).unwrap(),
            )
        })
        .collect();
    safetensors::serialize_to_file(views, None, file).unwrap();
}

/// The emulator's and the CUDA engine's settings, none of which a child
/// process of a CUDA test inherits unless the test sets it.
pub const CUDA_SETTINGS: [&str; 9] = [
    "STATEBENCH_EMULATOR_CHECKS",
    "STATEBENCH_EMULATOR_FIBERS",
    "STATEBENCH_EMULATOR_MEMORY_GIB",
    "STATEBENCH_EMULATOR_ASAN",
    "STATEBENCH_EMULATOR_SCHEDULE_SEED",
    "STATEBENCH_EMULATOR_DRIVER_VERSION",
    "STATEBENCH_EMULATOR_NVRTC_VERSION",
    "STATEBENCH_CUDA_SOURCE_DIR",
    "STATEBENCH_CUDA_IMAGE",
];

/// This test binary's ignored `child` test in a process of its own, with
/// `case_var` set to `case`, the [`CUDA_SETTINGS`] cleared and `env` set:
/// whether it succeeded, and its stdout then stderr. (A failed kernel
/// fails its context for the rest of the process, and the emulator reads
/// its settings once a process, so such cases each need a process.)
pub fn in_child(case_var: &str, case: &str, env: &[(&str, &str)]) -> (bool, String) {
    let mut cmd = Command::new(std::env::current_exe().expect("test binary"));
    cmd.args([
        "child",
        "--exact",
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ])
    .env(case_var, case);
    for var in CUDA_SETTINGS {
        cmd.env_remove(var);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("the child runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// An OpenAI-style endpoint that lists one model (`m`) and answers every
/// chat call as `answer` says from the request's body (status, body);
/// counts the calls.
pub struct FakeEndpoint {
    pub url: String,
    pub calls: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
}

type Answer = dyn Fn(&[u8]) -> (u16, Vec<u8>) + Send + Sync;

impl FakeEndpoint {
    /// Every chat call answered with the same status and body.
    pub fn start(status: u16, body: Vec<u8>) -> FakeEndpoint {
        FakeEndpoint::scripted(move |_| (status, body.clone()))
    }

    /// Each chat call answered by `answer` from its request body.
    pub fn scripted(
        answer: impl Fn(&[u8]) -> (u16, Vec<u8>) + Send + Sync + 'static,
    ) -> FakeEndpoint {
        let answer: Arc<Answer> = Arc::new(answer);
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let calls = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (c, s) = (Arc::clone(&calls), Arc::clone(&stop));
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if s.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(mut conn) = conn else { continue };
                let mut r = BufReader::new(conn.try_clone().unwrap());
                let mut first = String::new();
                r.read_line(&mut first).ok();
                let mut length = 0;
                loop {
                    let mut h = String::new();
                    if r.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
                        break;
                    }
                    if let Some(v) = h.to_ascii_lowercase().strip_prefix("content-length:") {
                        length = v.trim().parse().unwrap_or(0);
                    }
                }
                let mut body_in = vec![0; length];
                r.read_exact(&mut body_in).ok();
                let (code, out) = if first.starts_with("GET /v1/models") {
                    (
                        200,
                        br#"{"object":"list","data":[{"id":"m","object":"model"}]}"#.to_vec(),
                    )
                } else {
                    c.fetch_add(1, Ordering::SeqCst);
                    answer(&body_in)
                };
                let head = format!(
                    "HTTP/1.1 {code} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    out.len()
                );
                conn.write_all(head.as_bytes()).ok();
                conn.write_all(&out).ok();
            }
        });
        FakeEndpoint { url, calls, stop }
    }
}

impl Drop for FakeEndpoint {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(self.url.trim_start_matches("http://"));
    }
}
