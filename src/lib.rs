//! statebench: how strongly should task state act on an LLM agent?
//!
//! The crate holds the in-process engine (`engine`), the one chat interface
//! the studies call (`backend`), the paper's testbed (`ladder`, with its
//! reports), what every study's run directory is made of (`rundir`),
//! statistics (`stats`) and tables (`table`), EAL-Bench's authorization-
//! memory study (`eal`: its own generator, writers, executor, scorer and
//! report over the same engine), and the OpenAI-compatible
//! server (`http_server`, over the wire format in `wire`). Data flows one
//! way: generator → episode → runner → arm → agent → receipts → task state →
//! scorer → log line. The scorer never calls a model.

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
