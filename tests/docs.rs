//! The documentation cannot rot: every `statebench …` command line in
//! README.md and the book (`docs/src/`) names a real subcommand and only
//! flags its `--help` lists (canonical names: a hidden alias is not listed),
//! every relative link and image resolves (anchors included), every page of
//! the book is in its SUMMARY, and CI runs exactly the README's test command.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// README.md and every Markdown page under docs/src, sorted.
fn pages() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "md") {
                out.push(path);
            }
        }
    }
    let mut out = vec![root().join("README.md")];
    walk(&root().join("docs/src"), &mut out);
    out.sort();
    out
}

fn rel(path: &Path) -> String {
    path.strip_prefix(root())
        .unwrap_or(path)
        .display()
        .to_string()
}

/// A page split into its prose lines and its fenced code blocks (with the
/// fence's language), each with the line number it starts on.
struct Page {
    prose: Vec<(usize, String)>,
    blocks: Vec<(usize, String, Vec<String>)>,
}

fn parse(text: &str) -> Page {
    let mut page = Page {
        prose: Vec::new(),
        blocks: Vec::new(),
    };
    let mut open: Option<(usize, String, Vec<String>)> = None;
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        if let Some(rest) = trimmed.strip_prefix("```") {
            match open.take() {
                Some(block) => page.blocks.push(block),
                None => open = Some((i + 1, rest.trim().to_string(), Vec::new())),
            }
            continue;
        }
        match open.as_mut() {
            Some((_, _, lines)) => lines.push(trimmed.to_string()),
            None => page.prose.push((i + 1, line.to_string())),
        }
    }
    assert!(open.is_none(), "a code fence is never closed");
    page
}

/// What `statebench <path> --help` says: its subcommands and its flags.
#[derive(Default, Clone)]
struct Help {
    commands: BTreeSet<String>,
    flags: BTreeSet<String>,
}

struct Cli {
    cache: BTreeMap<Vec<String>, Option<Help>>,
}

impl Cli {
    fn help(&mut self, path: &[String]) -> Option<Help> {
        if let Some(h) = self.cache.get(path) {
            return h.clone();
        }
        let out = Command::new(env!("CARGO_BIN_EXE_statebench"))
            .args(path)
            .arg("--help")
            .output()
            .unwrap();
        let help = out.status.success().then(|| {
            let text = String::from_utf8_lossy(&out.stdout);
            let mut help = Help::default();
            let mut in_commands = false;
            for line in text.lines() {
                if line.trim_end() == "Commands:" {
                    in_commands = true;
                    continue;
                }
                if in_commands {
                    // `  name  description`; wrapped descriptions are indented further.
                    if line.trim().is_empty() {
                        in_commands = false;
                    } else if line.starts_with("  ") && !line.starts_with("   ") {
                        let name = line.split_whitespace().next().unwrap_or_default();
                        help.commands.insert(name.to_string());
                    }
                    continue;
                }
                // Option lines: `  -h, --help` or `      --model <SPEC>`.
                let t = line.trim_start();
                let t = match t.as_bytes() {
                    [b'-', c, b',', b' ', ..] if *c != b'-' => &t[4..],
                    _ => t,
                };
                if let Some(name) = t.strip_prefix("--") {
                    let name: String = name
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                        .collect();
                    if !name.is_empty() && line.starts_with("  ") {
                        help.flags.insert(name);
                    }
                }
            }
            help
        });
        self.cache.insert(path.to_vec(), help.clone());
        help
    }

    /// Checks one command line's words after `statebench`; the error names
    /// what is wrong.
    fn check(&mut self, words: &[&str]) -> Result<(), String> {
        let mut paths: Vec<Vec<String>> = vec![Vec::new()];
        let mut flags: Vec<String> = Vec::new();
        let mut positional = false;
        for raw in words {
            let word = raw.trim_start_matches(['[', '(', '"', '\'']);
            let word = word.trim_end_matches([']', ')', ',', '"', '\'', '.', ';', ':']);
            if let Some(flag) = word.strip_prefix("--") {
                let name: String = flag
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                    .collect();
                if !name.is_empty() {
                    flags.push(name);
                }
                continue;
            }
            let is_word = !word.is_empty()
                && word.split('|').all(|w| {
                    w.chars().next().is_some_and(|c| c.is_ascii_lowercase())
                        && w.chars()
                            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                });
            if positional || !flags.is_empty() || !is_word || word != *raw {
                positional = true;
                continue;
            }
            let help = self.help(&paths[0]).ok_or("no help")?;
            if help.commands.is_empty() {
                positional = true;
                continue;
            }
            let mut next = Vec::new();
            for path in &paths {
                let commands = self.help(path).ok_or("no help")?.commands;
                for alt in word.split('|') {
                    if !commands.contains(alt) {
                        return Err(format!(
                            "`statebench {}` has no subcommand `{alt}`",
                            path.join(" ")
                        ));
                    }
                    let mut p = path.clone();
                    p.push(alt.to_string());
                    next.push(p);
                }
            }
            paths = next;
        }
        for flag in flags {
            let mut known = false;
            for path in &paths {
                known |= self.help(path).ok_or("no help")?.flags.contains(&flag);
            }
            if !known {
                let names: Vec<String> = paths.iter().map(|p| p.join(" ")).collect();
                return Err(format!(
                    "`--{flag}` is not listed by `statebench {} --help`",
                    names.join("|")
                ));
            }
        }
        Ok(())
    }
}

/// The words after each `statebench` at a command position in a shell line:
/// at its start, after `VAR=value` assignments or a separator, or as
/// `cargo run … -- ARGS`.
fn commands_in(line: &str) -> Vec<Vec<&str>> {
    let line = match line.find(" #") {
        Some(i) => &line[..i],
        None => line,
    };
    let line = line.strip_prefix("$ ").unwrap_or(line);
    if line.starts_with('#') {
        return Vec::new();
    }
    let words: Vec<&str> = line.split_whitespace().collect();
    let separators = [
        "&&", "||", ";", "|", "(", "$(", "time", "nohup", "exec", "env", "sudo",
    ];
    let mut out = Vec::new();
    let mut at_command = true;
    let mut i = 0;
    while i < words.len() {
        let w = words[i];
        let is_bin = w == "statebench" || w.ends_with("/statebench");
        if at_command && is_bin {
            let end = words[i + 1..]
                .iter()
                .position(|w| ["&&", "||", ";", "|", ">", "2>", ">>", "&"].contains(w))
                .map_or(words.len(), |p| i + 1 + p);
            out.push(words[i + 1..end].to_vec());
            i = end;
            continue;
        }
        if at_command && w == "cargo" && words.get(i + 1) == Some(&"run") {
            if let Some(p) = words[i..].iter().position(|w| *w == "--") {
                out.push(words[i + p + 1..].to_vec());
            }
            break;
        }
        at_command = separators.contains(&w)
            || (at_command
                && w.contains('=')
                && w.chars().next().is_some_and(|c| c.is_ascii_uppercase()));
        i += 1;
    }
    out
}

fn is_shell(lang: &str) -> bool {
    matches!(lang, "" | "sh" | "bash" | "shell" | "console" | "text")
}

#[test]
fn every_command_line_names_real_subcommands_and_listed_flags() {
    let mut cli = Cli {
        cache: BTreeMap::new(),
    };
    let mut checked = 0;
    let mut errors = Vec::new();
    for file in pages() {
        let page = parse(&std::fs::read_to_string(&file).unwrap());
        let mut lines: Vec<(usize, String)> = Vec::new();
        for (start, lang, block) in &page.blocks {
            if !is_shell(lang) {
                continue;
            }
            // A trailing backslash continues the command on the next line.
            let mut joined = String::new();
            let mut first = 0;
            for (k, line) in block.iter().enumerate() {
                if joined.is_empty() {
                    first = start + 1 + k;
                }
                match line.strip_suffix('\\') {
                    Some(head) => {
                        joined.push_str(head);
                        joined.push(' ');
                    }
                    None => {
                        joined.push_str(line);
                        lines.push((first, std::mem::take(&mut joined)));
                    }
                }
            }
        }
        // Inline spans that are a command: `statebench …`.
        for (n, line) in &page.prose {
            for (k, span) in line.split('`').enumerate() {
                if k % 2 == 1 && span.starts_with("statebench ") {
                    lines.push((*n, span.to_string()));
                }
            }
        }
        for (n, line) in lines {
            for words in commands_in(&line) {
                // `check gpu` exists only in builds with the CUDA engine.
                if !cfg!(feature = "cuda") && words.starts_with(&["check", "gpu"]) {
                    continue;
                }
                checked += 1;
                if let Err(e) = cli.check(&words) {
                    errors.push(format!("{}:{n}: {e}\n    {}", rel(&file), line.trim()));
                }
            }
        }
    }
    assert!(
        checked > 100,
        "only {checked} command lines found: the parser is broken"
    );
    assert!(
        errors.is_empty(),
        "{} command lines are wrong:\n{}",
        errors.len(),
        errors.join("\n")
    );
}

/// The anchor a heading gets (mdBook's and GitHub's rule: lower case,
/// letters, digits, `-` and `_` kept, spaces to `-`, the rest dropped).
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

fn anchors(file: &Path) -> BTreeSet<String> {
    let page = parse(&std::fs::read_to_string(file).unwrap());
    page.prose
        .iter()
        .filter_map(|(_, l)| l.strip_prefix('#'))
        .map(|h| slug(h.trim_start_matches('#')))
        .collect()
}

/// Every `[text](target)` and `![alt](target)` outside code, with its line.
fn links(page: &Page) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (n, line) in &page.prose {
        // Inline code is not a link.
        let text: String = line
            .split('`')
            .enumerate()
            .filter(|(k, _)| k % 2 == 0)
            .map(|(_, s)| s)
            .collect::<Vec<_>>()
            .join(" ");
        let mut rest = text.as_str();
        while let Some(i) = rest.find("](") {
            let after = &rest[i + 2..];
            let Some(end) = after.find(')') else { break };
            let target = after[..end]
                .split_whitespace()
                .next()
                .unwrap_or("")
                .to_string();
            out.push((*n, target));
            rest = &after[end..];
        }
    }
    out
}

#[test]
fn every_relative_link_and_image_resolves() {
    let mut checked = 0;
    let mut errors = Vec::new();
    for file in pages() {
        let page = parse(&std::fs::read_to_string(&file).unwrap());
        for (n, target) in links(&page) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            checked += 1;
            let (path, anchor) = match target.split_once('#') {
                Some((p, a)) => (p, Some(a)),
                None => (target.as_str(), None),
            };
            let resolved = if path.is_empty() {
                file.clone()
            } else {
                file.parent().unwrap().join(path)
            };
            if !resolved.exists() {
                errors.push(format!("{}:{n}: `{target}` does not exist", rel(&file)));
                continue;
            }
            if let Some(anchor) = anchor {
                if resolved.extension().is_some_and(|e| e == "md")
                    && !anchors(&resolved).contains(anchor)
                {
                    errors.push(format!(
                        "{}:{n}: `{target}`: no heading has that anchor",
                        rel(&file)
                    ));
                }
            }
        }
    }
    assert!(
        checked > 50,
        "only {checked} links found: the parser is broken"
    );
    assert!(
        errors.is_empty(),
        "{} links are broken:\n{}",
        errors.len(),
        errors.join("\n")
    );
}

#[test]
fn every_page_of_the_book_is_in_its_summary() {
    let src = root().join("docs/src");
    let summary = parse(&std::fs::read_to_string(src.join("SUMMARY.md")).unwrap());
    let listed: BTreeSet<PathBuf> = links(&summary)
        .into_iter()
        .map(|(_, t)| src.join(t))
        .collect();
    let orphans: Vec<String> = pages()
        .into_iter()
        .filter(|p| p.starts_with(&src) && !p.ends_with("SUMMARY.md") && !listed.contains(p))
        .map(|p| rel(&p))
        .collect();
    assert!(
        orphans.is_empty(),
        "pages not in docs/src/SUMMARY.md: {orphans:?}"
    );
}

#[test]
fn ci_runs_exactly_the_readme_test_command_and_the_book() {
    let readme = parse(&std::fs::read_to_string(root().join("README.md")).unwrap());
    let (_, _, quick) = readme
        .blocks
        .iter()
        .find(|(_, lang, _)| lang == "sh")
        .expect("the README's quick start is its first sh block");
    assert_eq!(quick.len(), 2, "the quick start is two commands: {quick:?}");
    assert_eq!(quick[0], "cargo run --release -- run");
    let ci = std::fs::read_to_string(root().join(".ci/run")).unwrap();
    let last = ci.lines().rev().find(|l| !l.trim().is_empty()).unwrap();
    assert_eq!(
        last.trim(),
        quick[1],
        ".ci/run must end with the README's test command"
    );
    assert!(
        ci.contains("mdbook build docs"),
        ".ci/run must build the book"
    );
}

#[test]
fn the_link_and_command_parsers_read_what_they_must() {
    assert_eq!(
        commands_in("STATEBENCH_CPU_ISA=avx2 statebench check logits --tokens 1 # note"),
        vec![vec!["check", "logits", "--tokens", "1"]]
    );
    assert_eq!(commands_in("cargo run --release -- run"), vec![vec!["run"]]);
    assert_eq!(
        commands_in("echo statebench ladder cell"),
        Vec::<Vec<&str>>::new()
    );
    let mut cli = Cli {
        cache: BTreeMap::new(),
    };
    assert!(cli.check(&["ladder", "cell", "--concurrency", "8"]).is_ok());
    assert!(cli
        .check(&["ladder", "cell", "--no-such-flag"])
        .unwrap_err()
        .contains("--no-such-flag"));
    // A hidden alias is not a documented name.
    assert!(cli.check(&["ladder", "cell", "--live", "8"]).is_err());
    assert!(cli
        .check(&["ladder", "sell"])
        .unwrap_err()
        .contains("no subcommand `sell`"));
    assert!(cli.check(&["eal", "run|report", "--out", "x"]).is_ok());
    assert_eq!(slug("Speed against llama.cpp"), "speed-against-llamacpp");
    let page = parse("see [a](b.md#c) and `[x](y)`\n```\n[no](link)\n```\n");
    assert_eq!(links(&page), vec![(1, "b.md#c".to_string())]);
}
