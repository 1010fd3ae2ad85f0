//! `tau2 run --tau2-src DIR`: τ²'s own prompt layouts and tool
//! descriptions read at run time from a checkout's `src/tau2` (here the
//! flattened copies beside the data), their hashes pinned in the manifest;
//! bad directories refused in one line. The expected texts are read from
//! the same files by the test, so the repository holds none of them.

mod engine_common;
mod tau2_common;

use std::path::Path;
use std::sync::{Arc, Mutex};

use engine_common::*;
use serde_json::Value;
use sha2::{Digest, Sha256};
use tau2_common::*;

fn reference_dir() -> std::path::PathBuf {
    data_dir().join("reference")
}

/// The first line of text after `marker` in one of τ²'s files.
fn line_after(file: &str, marker: &str) -> String {
    let text = std::fs::read_to_string(reference_dir().join(file)).unwrap();
    let at = text
        .find(marker)
        .unwrap_or_else(|| panic!("{marker} in {file}"))
        + marker.len();
    text[at..]
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap()
        .to_string()
}

#[test]
#[cfg_attr(
    not(has_tau2_data),
    ignore = "needs the τ² airline data at ../shared/tau2-airline"
)]
fn the_prompts_and_tool_descriptions_are_taus_own_and_pinned() {
    let seen: Arc<Mutex<Vec<Value>>> = Arc::default();
    let log = seen.clone();
    let calls = vec![(
        "get_user_details",
        serde_json::json!({"user_id": "mia_li_3668"}).to_string(),
    )];
    // Records every request, and answers as the scripted conversation.
    let ep = FakeEndpoint::scripted(move |body| {
        let req: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
        log.lock().unwrap().push(req.clone());
        (200, answer(&req, &calls, None, None))
    });
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("run");
    let out = out.to_str().unwrap();
    let data = data_dir();
    let data = data.to_str().unwrap();
    let src = reference_dir();
    let src = src.to_str().unwrap();
    let mut args = run_args(&ep.url, out, data, "raw");
    args.extend(["--tau2-src", src]);
    let o = statebench(&args);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));

    let requests = seen.lock().unwrap().clone();
    let agent = requests
        .iter()
        .find(|r| r.get("tools").is_some())
        .expect("an agent request");
    let system = agent["messages"][0]["content"].as_str().unwrap();
    let instruction = line_after("agent__llm_agent.py", "AGENT_INSTRUCTION = \"\"\"");
    assert!(system.contains(&instruction), "{system}");
    let policy = std::fs::read_to_string(data_dir().join("policy.md")).unwrap();
    assert!(system.contains(policy.trim()));
    assert!(
        !system.contains("You work as a customer service agent"),
        "not ours"
    );
    let tool = |name: &str| {
        agent["tools"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["function"]["name"] == name)
            .unwrap()["function"]
            .clone()
    };
    let cancel = tool("cancel_reservation");
    let tools_py =
        std::fs::read_to_string(reference_dir().join("domains__airline__tools.py")).unwrap();
    let def = tools_py.find("def cancel_reservation").unwrap();
    let open = def + tools_py[def..].find("\"\"\"").unwrap() + 3;
    let doc = tools_py[open..]
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap();
    assert_eq!(cancel["description"], doc);
    let arg = line_after(
        "domains__airline__tools.py",
        "reservation_id: The reservation ID",
    );
    let described = cancel["parameters"]["properties"]["reservation_id"]["description"]
        .as_str()
        .unwrap();
    assert!(
        described.starts_with("The reservation ID") && arg.len() > 3,
        "{described}"
    );
    // Every tool keeps statebench's parameters: only the words change.
    assert_eq!(agent["tools"].as_array().unwrap().len(), 14);
    let user = requests
        .iter()
        .find(|r| r.get("tools").is_none())
        .expect("a simulator request");
    let user_system = user["messages"][0]["content"].as_str().unwrap();
    let guidelines = std::fs::read_to_string(data_dir().join("simulation_guidelines.md")).unwrap();
    let first = guidelines.lines().find(|l| !l.trim().is_empty()).unwrap();
    assert!(user_system.starts_with(first), "{user_system}");
    assert!(user_system.contains("Task instructions:"), "the scenario");

    // The manifest pins the three files by their sha256.
    let manifest: Value = serde_json::from_str(
        &std::fs::read_to_string(Path::new(out).join("manifest.json")).unwrap(),
    )
    .unwrap();
    let pinned = manifest["config"]["tau2_src_sha256"].as_object().unwrap();
    assert_eq!(pinned.len(), 3);
    for (name, hash) in pinned {
        let bytes = std::fs::read(reference_dir().join(name.replace('/', "__"))).unwrap();
        assert_eq!(hash, &crate_hex(&Sha256::digest(&bytes)), "{name}");
    }
    let report = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        report.contains("prompts and tool descriptions: τ²'s own"),
        "{report}"
    );

    // Resuming without the option is another configuration: refused.
    let args = run_args(&ep.url, out, data, "raw");
    let o = statebench(&args);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("tau2_src_sha256"), "{err}");
}

fn crate_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
#[cfg_attr(
    not(has_tau2_data),
    ignore = "needs the τ² airline data at ../shared/tau2-airline"
)]
fn a_directory_without_taus_sources_is_refused_in_one_line() {
    let tmp = tempfile::tempdir().unwrap();
    let data = data_dir();
    let data = data.to_str().unwrap();
    let out = tmp.path().join("run");
    let out = out.to_str().unwrap();
    let ep = endpoint(Vec::new(), None);
    // An empty directory; then one whose agent prompt has no policy field.
    let empty = tmp.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let broken = tmp.path().join("broken");
    std::fs::create_dir(&broken).unwrap();
    for f in [
        "agent__llm_agent.py",
        "domains__airline__tools.py",
        "user__user_simulator.py",
    ] {
        let text = std::fs::read_to_string(reference_dir().join(f)).unwrap();
        std::fs::write(broken.join(f), text.replace("{domain_policy}", "{policy}")).unwrap();
    }
    for (dir, expect) in [
        (&empty, "give a tau2-bench checkout's src/tau2"),
        (&broken, "has no {domain_policy} field"),
    ] {
        let mut args = run_args(&ep.url, out, data, "raw");
        args.extend(["--tau2-src", dir.to_str().unwrap()]);
        let o = statebench(&args);
        assert!(!o.status.success());
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(err.contains(expect) && err.contains("--tau2-src"), "{err}");
    }
    assert!(!Path::new(out).exists(), "nothing was written");
}
