//! The command line as a user meets it: outputs, byte-identical episodes,
//! scoring replies from elsewhere, and one-line errors on bad input.

use std::fs;
use std::process::{Command, Output};

fn statebench(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_statebench"))
        .args(args)
        .output()
        .expect("binary runs")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).to_string()
}

fn fails_with(args: &[&str], needle: &str) {
    let o = statebench(args);
    assert!(!o.status.success(), "{args:?} should fail");
    let e = stderr(&o);
    assert!(e.contains(needle), "{args:?}: {e}");
    assert!(!e.contains("panicked"), "{args:?}: {e}");
}

#[test]
fn episode_json_is_byte_identical_across_runs() {
    let args = [
        "ladder",
        "episode",
        "--domain",
        "procurement",
        "--steps",
        "5",
        "--density",
        "0.15",
        "--seed",
        "100",
        "--json",
    ];
    let a = statebench(&args);
    let b = statebench(&args);
    assert!(a.status.success());
    assert_eq!(a.stdout, b.stdout);
    let v: serde_json::Value = serde_json::from_slice(&a.stdout).unwrap();
    assert_eq!(v["version"], "statebench-episode/1");
    assert_eq!(v["turns"].as_array().unwrap().len(), 44);
    assert_eq!(v["perfect_labels"].as_array().unwrap().len(), 44);
}

#[test]
fn bad_episode_inputs_get_one_line_errors() {
    fails_with(
        &["ladder", "episode", "--domain", "bakery"],
        "unknown domain 'bakery'",
    );
    fails_with(
        &["ladder", "episode", "--steps", "19"],
        "steps must be in 1..=18, got 19",
    );
    fails_with(
        &["ladder", "episode", "--steps", "0"],
        "steps must be in 1..=18, got 0",
    );
    fails_with(
        &["ladder", "episode", "--density", "1.5"],
        "density must be in [0, 1], got 1.5",
    );
    fails_with(
        &["ladder", "episode", "--paraphrase-tier", "2"],
        "needs a rewrite cache",
    );
    fails_with(
        &[
            "ladder",
            "episode",
            "--paraphrase-tier",
            "2",
            "--paraphrase-cache",
            "/nonexistent/cache.json",
        ],
        "/nonexistent/cache.json",
    );
}

#[test]
fn score_recorded_replies() {
    let tmp = tempfile::tempdir().unwrap();
    let ep_path = tmp.path().join("ep.json");
    let o = statebench(&[
        "ladder", "episode", "--steps", "5", "--seed", "101", "--json",
    ]);
    fs::write(&ep_path, &o.stdout).unwrap();
    let ep: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();

    // Replies that book exactly what the perfect labels ask, in markdown.
    let codes: Vec<String> = ep["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["code"].as_str().unwrap().to_string())
        .collect();
    let mut replies = String::new();
    for (i, (t, l)) in ep["turns"]
        .as_array()
        .unwrap()
        .iter()
        .zip(ep["perfect_labels"].as_array().unwrap())
        .enumerate()
    {
        let reply = match l["label"].as_str().unwrap() {
            "execute" | "redo" => {
                let step = l["step"].as_str().unwrap();
                let k: usize = step[1..].parse::<usize>().unwrap() - 1;
                format!(
                    "Done.\n- **ref {}/{}**",
                    codes[k],
                    t["work_order"].as_str().unwrap()
                )
            }
            _ => "Noted, nothing booked.".to_string(),
        };
        replies += &serde_json::json!({"turn": i, "reply": reply}).to_string();
        replies.push('\n');
    }
    let good = tmp.path().join("replies.jsonl");
    fs::write(&good, &replies).unwrap();
    for arm in ["raw", "checklist", "directive", "enforce"] {
        let o = statebench(&[
            "ladder",
            "score",
            "--episode",
            ep_path.to_str().unwrap(),
            "--replies",
            good.to_str().unwrap(),
            "--arm",
            arm,
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(v["strict"], true, "{arm}");
        assert_eq!(v["turns"].as_array().unwrap().len(), 44);
    }

    // A reply that re-books every finished step's code on every turn fails raw.
    let bad_replies: String = (0..44)
        .map(|i| {
            let wo = ep["turns"][i]["work_order"].as_str().unwrap();
            let lines: Vec<String> = codes.iter().map(|c| format!("ref {c}/{wo}")).collect();
            serde_json::json!({"turn": i, "reply": lines.join("\n")}).to_string() + "\n"
        })
        .collect();
    let bad = tmp.path().join("bad.jsonl");
    fs::write(&bad, bad_replies).unwrap();
    let o = statebench(&[
        "ladder",
        "score",
        "--episode",
        ep_path.to_str().unwrap(),
        "--replies",
        bad.to_str().unwrap(),
    ]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["strict"], false);
    assert!(v["channels"]["re_execution"].as_u64().unwrap() > 0);

    // Missing turn, extra turn, duplicate turn, malformed line, wrong version.
    let lines: Vec<&str> = replies.lines().collect();
    let write = |name: &str, body: String| {
        let p = tmp.path().join(name);
        fs::write(&p, body).unwrap();
        p
    };
    let ep_arg = ep_path.to_str().unwrap().to_string();
    let score = |p: &std::path::Path, needle: &str| {
        fails_with(
            &[
                "ladder",
                "score",
                "--episode",
                &ep_arg,
                "--replies",
                p.to_str().unwrap(),
            ],
            needle,
        )
    };
    score(
        &write("missing.jsonl", lines[..43].join("\n")),
        "no reply for turn(s) 43",
    );
    score(
        &write(
            "extra.jsonl",
            replies.clone() + "{\"turn\": 44, \"reply\": \"x\"}\n",
        ),
        ":45: turn 44 is past the episode's last turn 43",
    );
    score(
        &write("dup.jsonl", replies.clone() + lines[0] + "\n"),
        ":45: turn 0 appears twice",
    );
    score(
        &write("malformed.jsonl", format!("{}\n{{\"turn\": 1,\n", lines[0])),
        "malformed.jsonl:2:",
    );
    let mut old: serde_json::Value = ep.clone();
    old["version"] = "statebench-episode/0".into();
    let old_path = write("old.json", old.to_string());
    fails_with(
        &[
            "ladder",
            "score",
            "--episode",
            old_path.to_str().unwrap(),
            "--replies",
            good.to_str().unwrap(),
        ],
        "episode version 'statebench-episode/0'",
    );
    fails_with(
        &[
            "ladder",
            "score",
            "--episode",
            "/nonexistent/ep.json",
            "--replies",
            good.to_str().unwrap(),
        ],
        "/nonexistent/ep.json",
    );
}

#[test]
fn cell_and_report_formats() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("cell");
    let o = statebench(&[
        "ladder",
        "cell",
        "--agent",
        "always-book",
        "--arms",
        "raw,checklist,directive,enforce",
        "--steps",
        "6",
        "--episodes",
        "20",
        "--seed-start",
        "100",
        "--out",
        out.to_str().unwrap(),
        "--quiet",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("Ladder (strict episode success)"));
    let o = statebench(&[
        "ladder",
        "report",
        out.to_str().unwrap(),
        "--format",
        "json",
    ]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let cell = &v["cells"][0];
    assert_eq!(cell["config"]["steps"], 6);
    let arms = cell["arms"].as_array().unwrap();
    assert_eq!(arms.len(), 4);
    assert_eq!(arms[0]["arm"], "raw");
    assert_eq!(arms[0]["episodes"], 20);
    assert_eq!(arms[3]["strict"], 20);
    assert_eq!(arms[3]["rate"], 1.0);
    assert!(arms[0]["wilson95"].as_array().unwrap().len() == 2);
    assert!(arms[0]["decline_aware"]["rate"].is_number());
    assert!(arms[0]["channels"]["re_execution"].as_u64().unwrap() > 0);
    let contrasts = cell["contrasts"].as_array().unwrap();
    assert_eq!(contrasts.len(), 3);
    assert_eq!(contrasts[2]["a"], "directive");
    assert!(contrasts[2]["p"].as_f64().unwrap() < 1e-4);
    assert!(contrasts[2]["p_holm"].as_f64().unwrap() >= contrasts[2]["p"].as_f64().unwrap());
    for fmt in ["md", "csv", "text"] {
        let o = statebench(&["ladder", "report", out.to_str().unwrap(), "--format", fmt]);
        assert!(o.status.success());
        assert!(String::from_utf8_lossy(&o.stdout).contains("enforce"));
    }
    fails_with(
        &[
            "ladder",
            "report",
            tmp.path().join("nothing").to_str().unwrap(),
        ],
        "not a statebench run directory",
    );
    fails_with(
        &["ladder", "cell", "--arms", "raw,telepathy", "--out", "x"],
        "unknown arm 'telepathy'",
    );
    // Resuming with a different setting names it.
    fails_with(
        &[
            "ladder",
            "cell",
            "--agent",
            "always-book",
            "--arms",
            "raw,checklist,directive,enforce",
            "--steps",
            "7",
            "--episodes",
            "20",
            "--out",
            out.to_str().unwrap(),
            "--quiet",
        ],
        "config.steps",
    );
}

#[test]
fn tier_two_episodes_draw_from_the_committed_rewrite_cache() {
    // Written by `statebench ladder paraphrase` with the default model.
    let cache_path = "tests/fixtures/ladder/paraphrases-default-model.json";
    let cache: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(cache_path).unwrap()).unwrap();
    let templates = cache["templates"].as_object().unwrap();
    assert_eq!(templates.len(), 36, "both pools, every template");
    let rewrites: Vec<String> = templates
        .values()
        .flat_map(|t| ["ask", "premature", "redo"].map(|f| t[f].clone()))
        .flat_map(|v| serde_json::from_value::<Vec<String>>(v).unwrap())
        .collect();
    assert_eq!(rewrites.len(), 36 * 9);
    let mut seen = 0;
    for (domain, seed) in [("procurement", "100"), ("release", "101")] {
        let o = statebench(&[
            "ladder",
            "episode",
            "--domain",
            domain,
            "--steps",
            "10",
            "--seed",
            seed,
            "--json",
            "--paraphrase-tier",
            "2",
            "--paraphrase-cache",
            cache_path,
        ]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let ep: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        for t in ep["turns"].as_array().unwrap() {
            if !matches!(t["kind"].as_str(), Some("ask" | "premature" | "redo_probe")) {
                continue;
            }
            let msg = t["message"].as_str().unwrap();
            let text = msg.split(" (#W").next().unwrap();
            assert!(
                rewrites.iter().any(|r| r == text),
                "{domain}: {msg:?} is not a cached rewrite"
            );
            seen += 1;
        }
    }
    assert!(seen >= 20, "only {seen} rewritten turns");
}

/// Where stderr is not a terminal (a log file, a pipe), a run writes
/// progress lines instead of a bar: done, rate, elapsed, time left.
#[test]
fn long_runs_write_progress_lines_to_logs() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("c");
    let run = |quiet: bool| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_statebench"));
        c.args(["ladder", "cell", "--agent", "perfect", "--steps", "3"])
            .args(["--episodes", "3", "--arms", "raw,checklist", "--out"])
            .arg(&out)
            .env("STATEBENCH_PROGRESS_SECS", "0");
        if quiet {
            c.arg("--quiet");
        }
        c.output().unwrap()
    };
    let e = stderr(&run(false));
    let lines: Vec<&str> = e.lines().filter(|l| l.starts_with("progress: ")).collect();
    assert_eq!(lines.len(), 6, "{e}");
    assert!(
        lines[5].starts_with("progress: 6/6 episode-arms (100.0%), ")
            && lines[5].contains(" elapsed, eta "),
        "{e}"
    );
    fs::remove_dir_all(&out).unwrap();
    assert!(!stderr(&run(true)).contains("progress: "));
}
