//! Hostile input, round three, on the run machinery and the server: two
//! processes on one run directory, lines written twice, failed model calls,
//! files that are not files, grids without limits, a report naming a
//! directory twice, and a server that must not be starved.

mod engine_common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use engine_common::*;
use serde_json::Value;
use statebench::backend::http_client::{OpenAiBackend, OpenAiOptions};
use statebench::backend::shared::SharedBackend;
use statebench::backend::{Backend, BackendError, ChatRequest, Message, Role};
use statebench::engine::{Engine, EngineOptions};
use statebench::http_server::{parse_chat, Listener};
use statebench::rundir::DirLock;

const BIN: &str = env!("CARGO_BIN_EXE_statebench");

/// Succeeds; returns stdout.
fn ok(args: &[&str]) -> String {
    let o = statebench(args);
    assert!(
        o.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn p(path: &Path) -> &str {
    path.to_str().unwrap()
}

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(String::from)
        .collect()
}

// 1. One process per run directory, and lines written twice count once.
#[test]
fn a_run_directory_is_written_by_one_process_at_a_time() {
    let tmp = tempfile::tempdir().unwrap();
    let pid = format!("pid {}", std::process::id());
    let cell = tmp.path().join("cell");
    let held = DirLock::acquire(&cell).unwrap();
    let args = [
        "ladder",
        "cell",
        "--agent",
        "perfect",
        "--steps",
        "3",
        "--episodes",
        "2",
        "--quiet",
        "--out",
    ];
    let mut cell_args = args.to_vec();
    cell_args.push(p(&cell));
    refused(&cell_args, &pid);
    assert!(
        !cell.join("manifest.json").exists(),
        "the refused run wrote"
    );
    drop(held);
    ok(&cell_args);

    // A grid, and a cell of a grid that is running.
    let grid = tmp.path().join("grid");
    let held = DirLock::acquire(&grid).unwrap();
    let grid_args = [
        "ladder",
        "grid",
        "--agent",
        "perfect",
        "--steps",
        "3,4",
        "--episodes",
        "1",
        "--quiet",
        "--out",
        p(&grid),
    ];
    refused(&grid_args, &pid);
    let inner = grid.join("S3");
    let mut inner_args = args.to_vec();
    inner_args.push(p(&inner));
    refused(&inner_args, &pid);
    drop(held);
    ok(&grid_args);

    // An EAL study.
    let study = tmp.path().join("eal");
    let held = DirLock::acquire(&study).unwrap();
    let eal_args = [
        "eal",
        "run",
        "--cases",
        "2",
        "--writer",
        "ledger",
        "--executor",
        "follow-evidence",
        "--quiet",
        "--out",
        p(&study),
    ];
    refused(&eal_args, &pid);
    drop(held);
    ok(&eal_args);
}

#[test]
fn lines_written_twice_are_counted_once_and_the_count_reported() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
    for d in [&a, &b] {
        ok(&[
            "ladder",
            "cell",
            "--agent",
            "always-book",
            "--steps",
            "5",
            "--episodes",
            "3",
            "--quiet",
            "--out",
            p(d),
        ]);
    }
    // `b`'s logs appended to themselves, as a second writer would have.
    let mut doubled = 0;
    for log in ["episodes.jsonl", "turns.jsonl"] {
        let text = std::fs::read_to_string(b.join(log)).unwrap();
        doubled += text.lines().count();
        std::fs::OpenOptions::new()
            .append(true)
            .open(b.join(log))
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
    }
    let report = |d: &Path| -> Value {
        let mut v: Value =
            serde_json::from_str(&ok(&["ladder", "report", p(d), "--format", "json"])).unwrap();
        let cell = &mut v["cells"][0];
        cell["dir"] = Value::Null;
        for arm in cell["arms"].as_array_mut().unwrap() {
            arm["accounting"]["wall_s"] = Value::Null;
        }
        v
    };
    let (mut ra, mut rb) = (report(&a), report(&b));
    assert!(
        ra.to_string().contains("\"trap\""),
        "the cell has trap-turn probes to double"
    );
    assert_eq!(rb["cells"][0]["duplicates"], doubled, "{rb}");
    rb["cells"][0].as_object_mut().unwrap().remove("duplicates");
    ra["cells"][0].as_object_mut().unwrap().remove("duplicates");
    assert_eq!(ra, rb, "a doubled log reports as the clean one");
    let text = ok(&["ladder", "report", p(&b)]);
    assert!(
        text.contains("duplicate lines dropped") && text.contains(&doubled.to_string()),
        "{text}"
    );
}

/// The flags of a small cell whose agent is the model at `url` (matcher
/// and compiler oracle, so only agent calls reach it), one episode-arm at
/// a time.
fn model_agent_on<'a>(url: &'a str, arms: &'a str) -> Vec<&'a str> {
    vec![
        "--agent",
        "model",
        "--matcher",
        "oracle",
        "--compiler",
        "oracle",
        "--steps",
        "3",
        "--episodes",
        "4",
        "--arms",
        arms,
        "--concurrency",
        "1",
        "--quiet",
        "--endpoint",
        url,
    ]
}

// 2. Failed model calls are not agent behaviour.
#[test]
fn failed_agent_calls_are_counted_apart_stop_the_cell_and_run_again() {
    let tmp = tempfile::tempdir().unwrap();
    let bad_request = FakeEndpoint::start(
        400,
        br#"{"error":{"message":"unsupported parameter","type":"invalid_request_error"}}"#.to_vec(),
    );
    let out = tmp.path().join("c");
    let args = [
        &["ladder", "cell"][..],
        &model_agent_on(&bad_request.url, "raw,checklist"),
        &["--out", p(&out)],
    ]
    .concat();
    refused(&args, "3 episodes in a row ended in failed agent calls");
    let first = lines(&out.join("episodes.jsonl"));
    assert_eq!(first.len(), 3, "the failed episodes are logged");
    let key = |l: &String| -> (u64, String, u64) {
        let v: Value = serde_json::from_str(l).unwrap();
        (
            v["seed"].as_u64().unwrap(),
            v["arm"].as_str().unwrap().to_string(),
            v["failed_calls"].as_u64().unwrap_or(0),
        )
    };
    assert!(first.iter().all(|l| key(l).2 > 0), "{first:?}");

    // Every report format counts them, and no rate includes them.
    let json: Value =
        serde_json::from_str(&ok(&["ladder", "report", p(&out), "--format", "json"])).unwrap();
    let arms = json["cells"][0]["arms"].as_array().unwrap();
    let failed: u64 = arms
        .iter()
        .map(|a| a["failed_episodes"].as_u64().unwrap_or(0))
        .sum();
    let calls: u64 = arms
        .iter()
        .map(|a| a["failed_calls"].as_u64().unwrap_or(0))
        .sum();
    assert_eq!(failed, 3);
    assert_eq!(calls, first.iter().map(|l| key(l).2).sum::<u64>());
    assert!(arms.iter().all(|a| a["episodes"] == 0), "{json}");
    let text = ok(&["ladder", "report", p(&out)]);
    assert!(text.contains("Failed agent calls"), "{text}");
    let csv = ok(&["ladder", "report", p(&out), "--format", "csv"]);
    let head: Vec<&str> = csv.lines().next().unwrap().split(',').collect();
    let col = head.iter().position(|h| *h == "failed_episodes").unwrap();
    let per_arm: u64 = csv
        .lines()
        .skip(1)
        .map(|l| l.split(',').nth(col).unwrap().parse::<u64>().unwrap())
        .sum();
    assert_eq!(per_arm, 3, "{csv}");

    // A resume runs them again (the same three, first in the order).
    refused(&args, "failed agent calls");
    let again = lines(&out.join("episodes.jsonl"));
    assert_eq!(again.len(), 6);
    let k = |ls: &[String]| ls.iter().map(|l| (key(l).0, key(l).1)).collect::<Vec<_>>();
    assert_eq!(k(&again[3..]), k(&first));

    // A body that is not JSON is a failed call too, answered once.
    let garbage = FakeEndpoint::start(200, b"<html>upstream error</html>".to_vec());
    let out2 = tmp.path().join("c2");
    let mut args2 = args.to_vec();
    let n = args2.len();
    args2[n - 3] = &garbage.url;
    args2[n - 1] = p(&out2);
    let err = refused(&args2, "failed agent calls");
    assert!(err.contains("malformed reply"), "{err}");
}

// 4. Reads stay bounded whatever sits at a path.
/// A grid run in shards: the report over the shards counts every shard's
/// failed episodes, as it counts every shard's finished ones.
#[test]
fn failed_episodes_of_every_shard_are_counted() {
    let tmp = tempfile::tempdir().unwrap();
    let bad_request = FakeEndpoint::start(400, br#"{"error":{"message":"no"}}"#.to_vec());
    let shards: Vec<_> = (0..2).map(|i| tmp.path().join(format!("g{i}"))).collect();
    for (i, out) in shards.iter().enumerate() {
        let shard = format!("{i}/2");
        statebench(
            &[
                &["ladder", "grid"][..],
                &model_agent_on(&bad_request.url, "raw"),
                &["--shard", &shard, "--out", p(out)],
            ]
            .concat(),
        );
    }
    let logged: usize = shards
        .iter()
        .map(|d| lines(&d.join("cell/episodes.jsonl")).len())
        .sum();
    assert_eq!(logged, 4, "every episode failed and was logged");
    let json: Value = serde_json::from_str(&ok(&[
        "ladder",
        "report",
        p(&shards[0]),
        p(&shards[1]),
        "--format",
        "json",
    ]))
    .unwrap();
    assert_eq!(json["cells"][0]["arms"][0]["failed_episodes"], 4, "{json}");
}

#[test]
fn logs_and_manifests_are_read_only_from_regular_files_within_bounds() {
    let tmp = tempfile::tempdir().unwrap();
    let c = tmp.path().join("c");
    let cell = [
        "ladder",
        "cell",
        "--agent",
        "perfect",
        "--steps",
        "3",
        "--episodes",
        "1",
        "--quiet",
        "--out",
        p(&c),
    ];
    ok(&cell);
    let keep = |name: &str| {
        let saved = tmp.path().join(format!("{name}.saved"));
        std::fs::rename(c.join(name), &saved).unwrap();
        saved
    };
    let restore = |name: &str, saved: &Path| {
        std::fs::remove_file(c.join(name)).unwrap();
        std::fs::rename(saved, c.join(name)).unwrap();
    };
    for (name, target) in [
        ("turns.jsonl", "/dev/zero"),
        ("episodes.jsonl", "/dev/zero"),
        ("manifest.json", "/dev/urandom"),
    ] {
        let saved = keep(name);
        std::os::unix::fs::symlink(target, c.join(name)).unwrap();
        refused(&["ladder", "report", p(&c)], "is not a regular file");
        refused(&cell, "is not a regular file");
        restore(name, &saved);
    }
    // A FIFO would block the reader forever.
    let saved = keep("episodes.jsonl");
    let fifo = Command::new("mkfifo")
        .arg(c.join("episodes.jsonl"))
        .status();
    assert!(fifo.unwrap().success());
    refused(&["ladder", "report", p(&c)], "is not a regular file");
    restore("episodes.jsonl", &saved);
    // A line no log holds.
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(c.join("turns.jsonl"))
        .unwrap();
    f.write_all(&vec![b'x'; (16 << 20) + 1]).unwrap();
    f.write_all(b"\n").unwrap();
    refused(&["ladder", "report", p(&c)], "a line longer than");

    // An EAL study's logs.
    let e = tmp.path().join("eal");
    ok(&[
        "eal",
        "run",
        "--cases",
        "2",
        "--writer",
        "ledger",
        "--executor",
        "follow-evidence",
        "--quiet",
        "--out",
        p(&e),
    ]);
    std::fs::remove_file(e.join("trials.jsonl")).unwrap();
    std::os::unix::fs::symlink("/dev/zero", e.join("trials.jsonl")).unwrap();
    refused(&["eal", "report", p(&e)], "is not a regular file");
}

// 5. Grids have limits, and hold no file of a cell that is not writing.
#[test]
fn grids_past_the_cell_cap_are_refused_before_anything_is_crossed() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("huge.toml");
    // 18 × 10 × 10 × 100 × 2 × 2 × 3 × 2 = 4,320,000 cells.
    std::fs::write(
        &file,
        format!(
            "agent = \"perfect\"\n\
         steps = [1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18]\n\
         density = [0.0,0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9]\n\
         ambiguous_rate = [0.0,0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9]\n\
         model = [{models}]\n\
         thinking = [true, false]\n\
         brief = [\"original\", \"amended\"]\n\
         protocol = [\"text\", \"tool\", \"native\"]\n\
         paraphrase_tier = [0, 1]\n",
            models = (0..100)
                .map(|i| format!("\"m{i}\""))
                .collect::<Vec<_>>()
                .join(",")
        ),
    )
    .unwrap();
    refused(
        &["ladder", "grid", p(&file), "--dry-run"],
        "4320000 cells, more than a grid holds",
    );

    // 120 cells under 64 open files: each cell's logs are opened as it
    // writes, not all at the start.
    let grid = tmp.path().join("grid");
    let script = format!(
        "ulimit -n 64 && exec {BIN} ladder grid --agent perfect --arms raw --episodes 1 \
         --steps 1,2,3,4,5,6,7,8,9,10,11,12 --density 0,0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9 \
         --quiet --out {}",
        p(&grid)
    );
    let o = Command::new("sh").arg("-c").arg(&script).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let cells = std::fs::read_dir(&grid)
        .unwrap()
        .filter(|e| e.as_ref().unwrap().path().join("episodes.jsonl").is_file())
        .count();
    assert_eq!(cells, 120);
}

// 10. A report reads each directory once.
#[test]
fn a_report_naming_a_directory_twice_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let c = tmp.path().join("c");
    ok(&[
        "ladder",
        "cell",
        "--agent",
        "perfect",
        "--steps",
        "3",
        "--episodes",
        "1",
        "--quiet",
        "--out",
        p(&c),
    ]);
    let again = format!("{}/./", p(&c));
    refused(&["ladder", "report", p(&c), &again], "is named twice");
}

fn tiny_shared() -> SharedBackend {
    let tiny = root().join("tests/fixtures/engine/tiny-qwen2");
    let engine = Engine::load(p(&tiny), EngineOptions::default()).expect("loads");
    SharedBackend::spawn(Box::new(engine)).unwrap()
}

fn http(addr: std::net::SocketAddr, request: &[u8]) -> String {
    let mut c = TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    c.write_all(request).unwrap();
    let mut resp = String::new();
    c.read_to_string(&mut resp).unwrap();
    resp
}

fn post(path: &str, body: &str) -> Vec<u8> {
    format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

// 9. The server: conflicting lengths, a connection cap.
#[test]
fn serve_refuses_conflicting_lengths_and_answers_past_its_connection_cap() {
    let shared = tiny_shared();
    let server = Listener::bind("127.0.0.1", 0)
        .unwrap()
        .max_connections(3)
        .serve(shared.client(), shared.model_id().clone())
        .unwrap();
    let addr = server.addr();
    let body = r#"{"messages":[{"role":"user","content":"hi"}],"max_tokens":2}"#;
    let two = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\nContent-Length: 5\r\n\r\n{body}",
        body.len()
    );
    let resp = http(addr, two.as_bytes());
    assert!(
        resp.starts_with("HTTP/1.1 400") && resp.contains("conflicting Content-Length"),
        "{resp}"
    );
    // Three idle connections hold every slot: the next is told so at once.
    let idle: Vec<TcpStream> = (0..3).map(|_| TcpStream::connect(addr).unwrap()).collect();
    let health = b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    let t = Instant::now();
    let mut resp = http(addr, health);
    while !resp.starts_with("HTTP/1.1 503") && t.elapsed() < Duration::from_secs(10) {
        // The accept thread may not have counted the idle ones yet.
        std::thread::sleep(Duration::from_millis(20));
        resp = http(addr, health);
    }
    assert!(resp.starts_with("HTTP/1.1 503"), "{resp}");
    assert!(resp.contains("3 connections are open"), "{resp}");
    drop(idle);
    let t = Instant::now();
    let mut resp = http(addr, health);
    while !resp.starts_with("HTTP/1.1 200") && t.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(20));
        resp = http(addr, health);
    }
    assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
}

// 9. A connection serves requests in turn, pipelined ones too, until it
// is asked to close.
#[test]
fn serve_keeps_connections_alive_and_answers_pipelined_requests() {
    let shared = tiny_shared();
    let server = Listener::bind("127.0.0.1", 0)
        .unwrap()
        .serve(shared.client(), shared.model_id().clone())
        .unwrap();
    let body = r#"{"messages":[{"role":"user","content":"hi"}],"max_tokens":2,"temperature":0}"#;
    let chat = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    // Three requests in one write, the last asking to close.
    let mut all = chat.clone().into_bytes();
    all.extend_from_slice(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n");
    all.extend_from_slice(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    let resp = http(server.addr(), &all);
    let heads: Vec<&str> = resp
        .split("\r\n\r\n")
        .filter_map(|part| part.rfind("HTTP/1.1 ").map(|i| &part[i..]))
        .collect();
    assert_eq!(heads.len(), 3, "{resp}");
    assert!(
        heads.iter().all(|h| h.starts_with("HTTP/1.1 200")),
        "{resp}"
    );
    assert!(
        heads[0].contains("Connection: keep-alive") && heads[2].contains("Connection: close"),
        "{resp}"
    );
    assert!(
        resp.contains("chat.completion")
            && resp.contains("\"object\":\"list\"")
            && resp.ends_with(r#"{"status":"ok"}"#),
        "{resp}"
    );
    // HTTP/1.0 closes after its answer.
    let resp = http(server.addr(), b"GET /health HTTP/1.0\r\n\r\n");
    assert!(resp.contains("Connection: close"), "{resp}");
}

// 9. Out of descriptors, the accept loop waits instead of spinning.
#[test]
fn serve_out_of_descriptors_does_not_spin() {
    let tiny = root().join("tests/fixtures/engine/tiny-qwen2");
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "ulimit -n 40 && exec {BIN} serve --port 0 --max-connections 1000 --model {}",
            p(&tiny)
        ))
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    while !line.contains("http://") {
        line.clear();
        assert!(err.read_line(&mut line).unwrap() > 0, "serve exited");
    }
    let addr = line
        .split("http://")
        .nth(1)
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .to_string();
    // More connections than the server has descriptors.
    let held: Vec<TcpStream> = (0..60)
        .filter_map(|_| TcpStream::connect(&addr).ok())
        .collect();
    let cpu = |pid: u32| -> f64 {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        let f: Vec<&str> = stat
            .rsplit(')')
            .next()
            .unwrap()
            .split_whitespace()
            .collect();
        // utime and stime, fields 14 and 15 (11 and 12 after the name).
        (f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap()) / 100.0
    };
    let before = cpu(child.id());
    std::thread::sleep(Duration::from_secs(2));
    let used = cpu(child.id()) - before;
    drop(held);
    // A spinning accept loop burns the whole two seconds.
    assert!(used < 0.5, "the server used {used:.2} s of CPU in 2 s");
    // And answers again once descriptors are free.
    let t = Instant::now();
    loop {
        let ok = TcpStream::connect(&addr).ok().and_then(|mut c| {
            c.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
            c.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                .ok()?;
            let mut s = String::new();
            c.read_to_string(&mut s).ok()?;
            Some(s)
        });
        if ok.is_some_and(|s| s.starts_with("HTTP/1.1 200")) {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "/health never answered"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    child.kill().ok();
    child.wait().ok();
}

// 3. Embeddings share the engine with chat, stop for a client gone, and
//    have a bound.
#[test]
fn embeddings_let_chat_through_stop_when_cancelled_and_are_bounded() {
    let shared = tiny_shared();
    let client = shared.client();
    // Chunked embedding gives each text the vector it gets alone.
    // About 400 tokens each: the 40 fill several chunks.
    let texts: Vec<String> = (0..40)
        .map(|i| format!("{i} {}", "word ".repeat(60 + i)))
        .collect();
    let all = client.embed(texts.clone()).unwrap();
    for (i, t) in texts.iter().enumerate() {
        let one = client.embed(vec![t.clone()]).unwrap();
        assert_eq!(one.vectors[0], all.vectors[i], "text {i}");
    }
    // Cancelled after the first chunk: nothing more is embedded.
    let asked = AtomicUsize::new(0);
    let r = client.embed_unless(texts.clone(), &|| asked.fetch_add(1, Ordering::SeqCst) > 0);
    assert!(matches!(r, Err(BackendError::Cancelled)), "{r:?}");
    assert_eq!(asked.load(Ordering::SeqCst), 2);

    let resp = {
        let server = Listener::bind("127.0.0.1", 0)
            .unwrap()
            .serve(client.clone(), shared.model_id().clone())
            .unwrap();
        http(server.addr(), &post("/v1/embeddings", &embed_body(2049, 1)))
    };
    assert!(
        resp.starts_with("HTTP/1.1 400") && resp.contains("more than the 2048"),
        "{resp}"
    );

    // A context long enough for long texts: 2,048 of about 800 tokens take
    // the tiny model over a minute.
    let tmp = tempfile::tempdir().unwrap();
    let long = tiny_copy(tmp.path(), "tiny-qwen2", 4096);
    let engine = Engine::load(p(&long), EngineOptions::default()).expect("loads");
    let shared = SharedBackend::spawn(Box::new(engine)).unwrap();
    let server = Listener::bind("127.0.0.1", 0)
        .unwrap()
        .serve(shared.client(), shared.model_id().clone())
        .unwrap();
    let addr = server.addr();
    let mut embedding = TcpStream::connect(addr).unwrap();
    embedding
        .write_all(&post("/v1/embeddings", &embed_body(2048, 200)))
        .unwrap();
    // Its texts are tokenized and embedding has begun.
    std::thread::sleep(Duration::from_secs(3));
    let chat = post(
        "/v1/chat/completions",
        r#"{"messages":[{"role":"user","content":"hi"}],"max_tokens":3,"temperature":0}"#,
    );
    assert!(http(addr, &chat).starts_with("HTTP/1.1 200"));
    embedding.set_nonblocking(true).unwrap();
    let mut b = [0u8; 1];
    assert!(
        embedding.peek(&mut b).is_err(),
        "the embedding request finished before the chat: nothing was tested"
    );
    // The client goes away: the rest of its texts are not embedded, so the
    // next chat does not wait for them (a minute and more) either.
    drop(embedding);
    assert!(http(addr, &chat).starts_with("HTTP/1.1 200"));
}

fn embed_body(n: usize, words: usize) -> String {
    let texts: Vec<String> = (0..n)
        .map(|i| format!("{i} {}", "word ".repeat(words)))
        .collect();
    serde_json::json!({ "input": texts }).to_string()
}

// 10. Seeds are integers in range; replies are bounded and text.
#[test]
fn seeds_out_of_range_and_bad_replies_fail_at_once_in_one_line() {
    let chat = |seed: &str| {
        parse_chat(
            format!(r#"{{"messages":[{{"role":"user","content":"q"}}],"seed":{seed}}}"#).as_bytes(),
        )
    };
    for bad in ["18446744073709551616", "1e3", "-9223372036854775809", "0.5"] {
        let e = chat(bad).unwrap_err().to_string();
        assert!(e.starts_with("seed must be an integer"), "{bad}: {e}");
    }
    assert_eq!(chat("18446744073709551615").unwrap().req.seed, u64::MAX);
    assert_eq!(chat("-1").unwrap().req.seed, u64::MAX);
    assert_eq!(chat("7").unwrap().req.seed, 7);

    let ask = |url: &str| {
        let mut opts = OpenAiOptions::new(url.to_string());
        opts.model = Some("m".into());
        let mut b = OpenAiBackend::new(opts).unwrap();
        let s = b.open_session();
        b.chat(
            s,
            ChatRequest::greedy(vec![Message::new(Role::User, "hi")], 4),
        )
    };
    // A reply of thousands of tool calls.
    let calls: Vec<Value> = (0..20_000)
        .map(|i| {
            serde_json::json!({"id": format!("c{i}"), "type": "function",
                "function": {"name": "f", "arguments": "{}"}})
        })
        .collect();
    let body = serde_json::json!({"choices": [{"message": {"role": "assistant", "tool_calls": calls},
        "finish_reason": "tool_calls"}]});
    let many = FakeEndpoint::start(200, body.to_string().into_bytes());
    let e = ask(&many.url).unwrap_err().to_string();
    assert!(e.contains("20000 tool calls, more than the 128"), "{e}");
    // A 200 whose body is not UTF-8 is the server's answer: asked once.
    let latin = FakeEndpoint::start(200, b"{\"choices\": \"\xff\xfe\"}".to_vec());
    let e = ask(&latin.url).unwrap_err().to_string();
    assert!(e.contains("not UTF-8"), "{e}");
    assert_eq!(latin.calls.load(Ordering::SeqCst), 1);
}
