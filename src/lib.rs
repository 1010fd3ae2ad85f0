//! statebench: how strongly should task state act on an LLM agent?
//!
//! Three layers, each using only those below it:
//!
//! ```text
//! studies   ladder (the paper's testbed) · eal (EAL-Bench) · tau2 (τ²-bench airline)
//!               │  call models only through
//! backend   the Backend interface · the HTTP client · the wire format
//!               │  implemented in-process by
//! engine    scheduler · KV cache · Qwen layers · device kernels
//! ```
//!
//! What two studies share lives once, below both: run directories
//! ([`rundir`]), statistics ([`stats`]), tables ([`table`]), progress lines
//! ([`progress`]) and seeded streams ([`rng`]). On top sit the
//! OpenAI-compatible server ([`http_server`], over [`wire`]) and the
//! measurements of `statebench bench` ([`mod@bench`]). Within a study data flows
//! one way: generator → episode → runner → arm → agent → receipts → task
//! state → scorer → log line. The scorer never calls a model.

pub mod backend;
pub mod base64;
pub mod bench;
pub mod eal;
pub mod engine;
pub mod http_server;
pub mod ladder;
pub mod progress;
pub mod rng;
pub mod rundir;
pub mod stats;
pub mod table;
pub mod tau2;
pub mod wire;

/// Bytes as lowercase hex (how digests are written everywhere).
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// An error and its sources on one line (`outer: inner: innermost`), for
/// logs and replies that carry errors as text.
pub fn one_line(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}
