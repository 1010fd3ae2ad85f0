//! `bench --perf-control CTL,ACK`: statebench tells a profiler (perf's
//! control protocol, played here by the test) to sample each timed part of
//! the engine figures alone, waits for each acknowledgement, and stops in
//! one line where the profiler is not there or stops answering.
#![cfg(unix)]

mod engine_common;

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::thread;

/// Two FIFOs, `ctl` and `ack`, in a fresh directory.
fn fifos() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let (ctl, ack) = (dir.path().join("ctl"), dir.path().join("ack"));
    for p in [&ctl, &ack] {
        assert!(Command::new("mkfifo").arg(p).status().unwrap().success());
    }
    (dir, ctl, ack)
}

/// `statebench bench` on the tiny checkpoint: prefill, then decode at
/// batches 1 and 2.
fn bench(ctl: &Path, ack: &Path) -> Output {
    let tiny = engine_common::root().join("tests/fixtures/engine/tiny-qwen2");
    Command::new(env!("CARGO_BIN_EXE_statebench"))
        .arg("bench")
        .arg("--model")
        .arg(&tiny)
        .args(["--prefill-tokens", "16", "--batches", "1,2"])
        .args(["--decode-steps", "2", "--turns", "0"])
        .arg("--perf-control")
        .arg(format!("{},{}", ctl.display(), ack.display()))
        .output()
        .expect("statebench runs")
}

/// Plays perf: holds `ctl` and `ack` open both ways, as perf does (so
/// statebench finds its reader without waiting), reads each command on
/// `ctl` and acknowledges the first `answer` of them; after that it closes
/// `ack`, as a profiler that stopped would. Returns the commands read when
/// the test writes `end`.
fn profiler(ctl: &Path, ack: &Path, answer: usize) -> (File, thread::JoinHandle<Vec<String>>) {
    let both = |p: &Path| OpenOptions::new().read(true).write(true).open(p).unwrap();
    let (ctl_in, end, ack_out) = (both(ctl), both(ctl), both(ack));
    let reader = thread::spawn(move || {
        let mut ack_out = Some(ack_out);
        let mut seen = Vec::new();
        for line in BufReader::new(ctl_in).lines() {
            let line = line.unwrap();
            if line == "end" {
                break;
            }
            seen.push(line);
            if seen.len() > answer {
                ack_out = None;
            }
            if let Some(a) = &mut ack_out {
                writeln!(a, "ack").unwrap();
            }
        }
        seen
    });
    (end, reader)
}

/// The commands the profiler read, once statebench has exited.
fn commands(mut end: File, reader: thread::JoinHandle<Vec<String>>) -> Vec<String> {
    writeln!(end, "end").unwrap();
    reader.join().unwrap()
}

#[test]
fn bench_marks_each_timed_part_for_a_profiler() {
    let (_dir, ctl, ack) = fifos();
    let (end, reader) = profiler(&ctl, &ack, usize::MAX);
    let out = bench(&ctl, &ack);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("prefill: 16 tokens"), "{stdout}");
    assert!(!stdout.contains("conversation"), "{stdout}");
    // Prefill's timed passes, then each batch's steps: not the load, the
    // ceilings or the prompts each decode measurement prefills first.
    assert_eq!(commands(end, reader), ["enable", "disable"].repeat(3));
}

#[test]
fn bench_stops_in_one_line_without_a_profiler() {
    let (_dir, ctl, ack) = fifos();
    // Nobody reads ctl: refused before the model loads, not a wait forever.
    let out = bench(&ctl, &ack);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("no profiler reads it"), "{err}");
    assert!(err.contains(&ctl.display().to_string()), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );

    // A profiler that stops answering after the first mark.
    let (end, reader) = profiler(&ctl, &ack, 1);
    let out = bench(&ctl, &ack);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("perf did not acknowledge `disable`"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert_eq!(commands(end, reader), ["enable", "disable"]);
}
