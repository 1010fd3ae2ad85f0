//! Results do not move by accident. Episode files, scripted cells' run logs
//! and reports, and `ladder score`'s output are compared with digests taken
//! from the release that preceded the engine and ladder restructuring
//! (commit eb7db7c), with wall-clock fields blanked. A change that alters
//! any of them alters results: it must say so and record new digests here
//! (`STATEBENCH_GOLDEN_PRINT=1 cargo test --release --test golden -- --nocapture`
//! prints them).

mod engine_common;

use std::path::Path;
use std::process::Command;

use regex::Regex;
use sha2::{Digest, Sha256};

const ALL_ARMS: &str = "raw,checklist,directive,enforce,checklist-replace,directive-system,\
                        directive-step,enforce-request,enforce-same-turn,ledger,hybrid";

/// The binary under test; `STATEBENCH_GOLDEN_BIN` points at another build
/// when the digests are recorded.
fn statebench(args: &[&str]) -> Vec<u8> {
    let bin = std::env::var("STATEBENCH_GOLDEN_BIN")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_statebench").to_string());
    let o = Command::new(bin).args(args).output().expect("binary runs");
    assert!(
        o.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    o.stdout
}

fn sha(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Blanks the fields that measure time (and the commit and directory,
/// which name where the run happened).
fn blank_timing(text: &str) -> String {
    let numbers = Regex::new(
        r#""(wall_s|latency_s|prefill_secs|decode_secs|prefill_tok_s|decode_tok_s)": ?-?[0-9.eE+-]+"#,
    )
    .expect("static regex");
    let strings = Regex::new(r#""(git_commit|dir)": ?"[^"]*""#).expect("static regex");
    let t = numbers.replace_all(text, "\"$1\":0");
    strings.replace_all(&t, "\"$1\":\"\"").into_owned()
}

/// A JSONL log's digest: lines blanked and sorted (workers finish in any
/// order). Each line's `config_hash` is left out: it is a digest of the
/// manifest, which is compared on its own (and the recorded logs predate it).
fn log_digest(path: &Path) -> String {
    let text = std::fs::read_to_string(path).expect("log");
    let hash = Regex::new(r#""config_hash":"[0-9a-f]{16}","#).expect("static regex");
    let mut lines: Vec<String> = text
        .lines()
        .map(|l| blank_timing(&hash.replace(l, "")))
        .collect();
    lines.sort();
    sha(lines.join("\n").as_bytes())
}

/// Compares digests with the recorded ones; prints them all when asked to.
fn check(results: &[(String, String)], expected: &[(&str, &str)]) {
    if std::env::var_os("STATEBENCH_GOLDEN_PRINT").is_some() {
        for (name, digest) in results {
            println!("(\"{name}\", \"{digest}\"),");
        }
    }
    assert_eq!(results.len(), expected.len());
    let moved: Vec<&str> = results
        .iter()
        .zip(expected)
        .filter(|((n, d), (en, ed))| {
            assert_eq!(n, en);
            d != ed
        })
        .map(|((n, _), _)| n.as_str())
        .collect();
    assert!(moved.is_empty(), "results moved: {moved:?}");
}

#[test]
fn episodes_are_unchanged() {
    let cache = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/ladder/paraphrases-default-model.json");
    let cache = cache.to_str().expect("utf-8 path");
    let specs: [&[&str]; 5] = [
        &[
            "--domain",
            "procurement",
            "--steps",
            "5",
            "--density",
            "0.15",
            "--seed",
            "100",
        ],
        &[
            "--domain",
            "release",
            "--steps",
            "18",
            "--density",
            "0.3",
            "--seed",
            "7",
            "--brief",
            "original",
        ],
        &[
            "--domain",
            "procurement",
            "--steps",
            "10",
            "--seed",
            "101",
            "--protocol",
            "tool",
            "--ambiguous-rate",
            "0.5",
        ],
        &[
            "--domain",
            "release",
            "--steps",
            "12",
            "--seed",
            "55",
            "--paraphrase-tier",
            "1",
        ],
        &[
            "--domain",
            "procurement",
            "--steps",
            "10",
            "--seed",
            "100",
            "--paraphrase-tier",
            "2",
            "--paraphrase-cache",
            cache,
        ],
    ];
    let mut results = Vec::new();
    for (i, spec) in specs.iter().enumerate() {
        for json in [true, false] {
            let mut args = vec!["ladder", "episode"];
            args.extend_from_slice(spec);
            if json {
                args.push("--json");
            }
            let name = format!("episode{} {}", i + 1, if json { "json" } else { "text" });
            results.push((name, sha(&statebench(&args))));
        }
    }
    check(&results, EPISODES);
}

#[test]
fn scripted_cells_reports_and_scores_are_unchanged() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = |name: &str| tmp.path().join(name).to_string_lossy().into_owned();
    let cells: [(&str, Vec<&str>); 3] = [
        (
            "perfect",
            vec![
                "--agent",
                "perfect",
                "--arms",
                ALL_ARMS,
                "--steps",
                "10",
                "--episodes",
                "20",
            ],
        ),
        (
            "always",
            vec![
                "--agent",
                "always-book",
                "--arms",
                ALL_ARMS,
                "--steps",
                "15",
                "--density",
                "0.3",
                "--episodes",
                "20",
                "--protocol",
                "tool",
                "--ambiguous-rate",
                "0.3",
            ],
        ),
        (
            "corrupt",
            vec![
                "--agent",
                "perfect",
                "--arms",
                "enforce,hybrid",
                "--steps",
                "15",
                "--density",
                "0.3",
                "--episodes",
                "20",
                "--corrupt",
                "0.01",
            ],
        ),
    ];
    let mut results = Vec::new();
    for (name, flags) in &cells {
        let out = dir(name);
        let mut args = vec!["ladder", "cell", "--quiet", "--out", out.as_str()];
        args.extend(flags.iter().copied());
        statebench(&args);
        let d = Path::new(&out);
        for log in ["episodes.jsonl", "turns.jsonl"] {
            results.push((format!("{name} {log}"), log_digest(&d.join(log))));
        }
        let manifest = std::fs::read_to_string(d.join("manifest.json")).expect("manifest");
        results.push((
            format!("{name} manifest.json"),
            sha(blank_timing(&manifest).as_bytes()),
        ));
        let report = statebench(&["ladder", "report", &out, "--format", "json"]);
        let report = blank_timing(&String::from_utf8_lossy(&report));
        results.push((format!("{name} report json"), sha(report.as_bytes())));
    }
    // `ladder score` on the always-book agent's raw replies of seed 100.
    let ep = statebench(&[
        "ladder",
        "episode",
        "--domain",
        "procurement",
        "--steps",
        "15",
        "--density",
        "0.3",
        "--seed",
        "100",
        "--protocol",
        "tool",
        "--ambiguous-rate",
        "0.3",
        "--json",
    ]);
    let ep_path = tmp.path().join("ep.json");
    std::fs::write(&ep_path, ep).expect("episode file");
    let mut replies: Vec<(u64, String)> = Vec::new();
    let turns = std::fs::read_to_string(tmp.path().join("always/turns.jsonl")).expect("turns");
    for line in turns.lines() {
        let t: serde_json::Value = serde_json::from_str(line).expect("turn line");
        if t["seed"] == 100 && t["arm"] == "raw" {
            let reply = serde_json::json!({ "turn": t["turn"], "reply": t["replies"][0] });
            replies.push((t["turn"].as_u64().expect("turn"), reply.to_string()));
        }
    }
    replies.sort();
    let replies_path = tmp.path().join("replies.jsonl");
    let text: String = replies.iter().map(|(_, r)| format!("{r}\n")).collect();
    std::fs::write(&replies_path, text).expect("replies file");
    for arm in ["raw", "enforce", "enforce-request", "hybrid"] {
        let out = statebench(&[
            "ladder",
            "score",
            "--episode",
            ep_path.to_str().expect("utf-8"),
            "--replies",
            replies_path.to_str().expect("utf-8"),
            "--arm",
            arm,
        ]);
        results.push((format!("score {arm}"), sha(&out)));
    }
    check(&results, CELLS);
}

/// Token for token: a model-backed cell on the default GGUF (agent, matcher
/// and compiler) on the CPU, under the kernels' arithmetic
/// `statebench-kernels/3`.
#[test]
#[cfg_attr(
    not(has_default_model),
    ignore = "needs the default model: run models/fetch.sh"
)]
fn default_model_cell_is_unchanged() {
    let gguf = engine_common::default_model();
    let tmp = tempfile::tempdir().expect("tempdir");
    let out = tmp.path().join("cell");
    statebench(&[
        "ladder",
        "cell",
        "--agent",
        "model",
        "--device",
        "cpu",
        "--model",
        gguf.to_str().expect("utf-8 path"),
        "--arms",
        "enforce",
        "--steps",
        "3",
        "--episodes",
        "1",
        "--quiet",
        "--out",
        out.to_str().expect("utf-8 path"),
    ]);
    let results: Vec<(String, String)> = ["episodes.jsonl", "turns.jsonl"]
        .iter()
        .map(|log| (format!("model {log}"), log_digest(&out.join(log))))
        .collect();
    check(&results, MODEL_CELL);
}

const MODEL_CELL: &[(&str, &str)] = &[
    (
        "model episodes.jsonl",
        "c8f65cd9470d137ac6ea3d8aa12a71a0a19b375f32e0581fea778f257bb098c5",
    ),
    (
        "model turns.jsonl",
        "ab528fdb0a8cdcf120847100eade6fb270c6a2e42f977a96a72bb8d78acb0804",
    ),
];

const EPISODES: &[(&str, &str)] = &[
    (
        "episode1 json",
        "03400a59e8813499eb992f586d46524cd3ec86a614b10557da83cdd6c32990a3",
    ),
    (
        "episode1 text",
        "1165c4be0568d0d41ab3055354e1aa74be2481ad26963578a8c991f583d5342d",
    ),
    (
        "episode2 json",
        "5e31e926372d4e63d61606e2fc7635e4463ce7c7886129f35aba9746b6b769f9",
    ),
    (
        "episode2 text",
        "4230405c15d38a5b1ab9bc74315b1310bc9171b359d36aa208f1c00db0b2e4a4",
    ),
    (
        "episode3 json",
        "a6d7e604958d337d216c007557ef3c2fd53bf5f0c3d59b380ad2b806d82259e3",
    ),
    (
        "episode3 text",
        "bb0c14af01a2f06e0e2832a94cbfb315b877a52733b9d889db1cca7b65934db1",
    ),
    (
        "episode4 json",
        "b131d9bd37bbaef8433f06f08a9e6b16f5cc05e69770b77c27e4b2962ba14fa6",
    ),
    (
        "episode4 text",
        "c59ee744747af9dc600998d6c120fb169d23bec259d3fa53034e9376f9f82131",
    ),
    (
        "episode5 json",
        "2b75d496fc0768bc804e1cde746b7d3881aea1feb949f3ddbc3416983a8d2455",
    ),
    (
        "episode5 text",
        "bc541643070435bc562ccd439e4d7cfb7178e4b24ccdf66051e91cdd8f6ff499",
    ),
];

const CELLS: &[(&str, &str)] = &[
    (
        "perfect episodes.jsonl",
        "11a2222716b979fad4b2a55f447a116a5d5ee350e158e178f1e4d2cc2a12c1c0",
    ),
    (
        "perfect turns.jsonl",
        "1b4eb9e62aa60817ff9a7c5683e4cbc4eeb8174a186db123b3f428eb07752e2c",
    ),
    (
        "perfect manifest.json",
        "79a44ecc26e0bed41916e8ed2c4559e71d84dc84d2a8a7add9a67cd9c1cb72b4",
    ),
    (
        "perfect report json",
        "e86070f091d90fcd803ac3e5e560d3794b3806f988209508d2788e45eebc2082",
    ),
    (
        "always episodes.jsonl",
        "900f343a8d93582777dcae1eeff17739133b502543d966532f68fa290ae8d724",
    ),
    (
        "always turns.jsonl",
        "9a4e03498cfad214aa46caed37533b63cccab4816c2fa4d89dc4cb679fa118a1",
    ),
    (
        "always manifest.json",
        "f6be05e86a9dd1fd35090146825bc22d99c1c059d0ca9c7e11d2e950a55f0f3d",
    ),
    // Re-recorded when the report gained the trap-turn probe: with its
    // seven `trap` objects removed, the report hashes to the eb7db7c digest
    // aa46fdff…f7f611.
    (
        "always report json",
        "6de66a76480206432a2bb098db2c417e048b0f5afbcd64296d189d6a6c140f30",
    ),
    (
        "corrupt episodes.jsonl",
        "bd85ba7a89800f36dde3b18007d5c7451ef46e496491865a6c5482d66c89036c",
    ),
    (
        "corrupt turns.jsonl",
        "dd250a56499ff424db85eecbde3e247031309672efb1366ad425e9611b2b75a8",
    ),
    (
        "corrupt manifest.json",
        "1af22d9b7c24d701bf6df0fdbc644e620a1dfc514e16b32ba4abfb76229aa2fa",
    ),
    (
        "corrupt report json",
        "d0de3b107eb48ea4f6aa2367f71153905b4bc7d2971d1c4d7277256cebbd052b",
    ),
    (
        "score raw",
        "6326eaf60f00640e488b110c9a4c31a9e675b6aabf5f7c0facdacf0258f96a5a",
    ),
    (
        "score enforce",
        "36766f438b37bfbd5dbcbaf3d540cd186d6adad16c393ad81f30f828c54da55a",
    ),
    (
        "score enforce-request",
        "e0568032dc1e15e9fbdf2ca4a076da74a5e1de6d680863a180293e312f78e20f",
    ),
    (
        "score hybrid",
        "eff902d31b7d3346d7659c959f9125d9a4fef82f32ce973a77caf76057956101",
    ),
];
