//! The figures and the HTML report, checked in a real browser: headless
//! Chromium renders the page of a small grid; the screenshot must not be
//! blank, and the DOM must hold the tables, the figures and the episode
//! the URL selects.

mod engine_common;

use std::path::{Path, PathBuf};
use std::process::Command;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_statebench"))
}

fn run(args: &[&str]) -> String {
    let o = bin().args(args).output().unwrap();
    assert!(
        o.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

/// A small grid with errors to show: the always-book agent at S = 5 and 8.
fn small_grid(dir: &Path) -> PathBuf {
    let out = dir.join("grid");
    run(&[
        "ladder",
        "grid",
        "--agent",
        "always-book",
        "--steps",
        "5,8",
        "--episodes",
        "3",
        "--out",
        out.to_str().unwrap(),
        "--quiet",
    ]);
    out
}

#[test]
fn svg_figures_are_written_one_file_each() {
    let tmp = tempfile::tempdir().unwrap();
    let grid = small_grid(tmp.path());
    let figs = tmp.path().join("figs");
    run(&[
        "ladder",
        "report",
        grid.to_str().unwrap(),
        "--format",
        "svg",
        "--out",
        figs.to_str().unwrap(),
    ]);
    let mut names: Vec<String> = std::fs::read_dir(&figs)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "channels.svg",
            "strip_S5_seed100.svg",
            "strip_S8_seed100.svg",
            "success-by-S.svg"
        ]
    );
    let success = std::fs::read_to_string(figs.join("success-by-S.svg")).unwrap();
    assert!(success.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""));
    // Four rungs × two S: a point with its interval each, a line per rung.
    assert_eq!(success.matches("<circle").count(), 8);
    assert_eq!(success.matches("<polyline").count(), 4);
    assert!(success.contains("raw, S=5: ") && success.contains("enforce, S=8: "));
    let channels = std::fs::read_to_string(figs.join("channels.svg")).unwrap();
    // The always-book agent re-executes on raw: a bar segment says so.
    assert!(channels.contains("raw: re_execution"), "{channels}");
    let strip = std::fs::read_to_string(figs.join("strip_S5_seed100.svg")).unwrap();
    assert!(strip.contains("turn 0 "));
    // Without --out, svg is refused in one line.
    let o = bin()
        .args([
            "ladder",
            "report",
            grid.to_str().unwrap(),
            "--format",
            "svg",
        ])
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("give a directory with --out"));
}

/// Headless Chromium, or None (skipped here, a failure in CI).
fn chromium() -> Option<PathBuf> {
    for name in ["chromium", "chromium-browser", "google-chrome"] {
        if let Ok(o) = Command::new("which").arg(name).output() {
            if o.status.success() {
                let p = String::from_utf8_lossy(&o.stdout).trim().to_string();
                return Some(PathBuf::from(p));
            }
        }
    }
    engine_common::missing("headless Chromium (Debian package chromium) is not installed");
    None
}

fn browser(chromium: &Path, profile: &Path) -> Command {
    let mut c = Command::new(chromium);
    c.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--hide-scrollbars",
        "--virtual-time-budget=5000",
    ])
    .arg(format!("--user-data-dir={}", profile.display()));
    c
}

#[test]
fn html_report_renders_in_a_browser_and_selects_an_episode() {
    let Some(chromium) = chromium() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let grid = small_grid(tmp.path());
    let page = tmp.path().join("report.html");
    run(&[
        "ladder",
        "report",
        grid.to_str().unwrap(),
        "--format",
        "html",
        "--out",
        page.to_str().unwrap(),
    ]);
    let html = std::fs::read_to_string(&page).unwrap();
    // Self-contained: nothing to fetch.
    for needle in ["src=\"http", "href=\"http", "<link", "@import", "src=\"//"] {
        assert!(
            !html.contains(needle),
            "the page fetches something: {needle}"
        );
    }

    let url = format!(
        "file://{}#cell=S8&arm=enforce&seed=101",
        page.to_str().unwrap()
    );
    let profile = tmp.path().join("profile");
    let o = browser(&chromium, &profile)
        .arg("--dump-dom")
        .arg(&url)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let dom = String::from_utf8_lossy(&o.stdout);
    assert!(dom.contains("Strict episode success"), "grid table");
    assert!(dom.contains("<th>raw</th><th>checklist</th><th>directive</th><th>enforce</th>"));
    assert_eq!(dom.matches("<svg").count(), 4, "figures inline");
    // The script ran and showed the episode the URL names.
    assert!(
        dom.contains("S8 · enforce · seed 101: "),
        "summary of the selected episode"
    );
    let rows = dom.matches("data-turn=\"").count();
    assert!(rows > 20, "{rows} turn rows");
    assert!(dom.contains("refused by the gate"), "the gate's verdicts");
    assert!(dom.contains("<option value=\"S5\">S5</option>"));

    // The screenshot is not blank.
    let shot = tmp.path().join("shot.png");
    let o = browser(&chromium, &profile)
        .arg(format!("--screenshot={}", shot.display()))
        .arg("--window-size=1200,1600")
        .arg(&url)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let decoder = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(&shot).unwrap()));
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).unwrap();
    let px = info.line_size / info.width as usize;
    let pixels: Vec<&[u8]> = buf[..info.buffer_size()].chunks(px).collect();
    let dark = pixels
        .iter()
        .filter(|p| p[..3].iter().all(|&c| c < 128))
        .count();
    let colours: std::collections::BTreeSet<[u8; 3]> =
        pixels.iter().map(|p| [p[0], p[1], p[2]]).collect();
    assert_eq!((info.width, info.height), (1200, 1600));
    assert!(
        dark > pixels.len() / 200,
        "{dark} dark pixels of {}",
        pixels.len()
    );
    assert!(colours.len() > 16, "{} colours", colours.len());
}

/// Every figure's text lies inside the figure, as the browser lays it out:
/// a one-cell report (the narrowest channels figure, whose title and legend
/// once ran off its edge) and the two-cell grid.
#[test]
fn figure_text_stays_inside_each_figure() {
    let Some(chromium) = chromium() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let one = tmp.path().join("one");
    run(&[
        "ladder",
        "cell",
        "--agent",
        "always-book",
        "--steps",
        "5",
        "--episodes",
        "2",
        "--out",
        one.to_str().unwrap(),
        "--quiet",
    ]);
    let grid = small_grid(tmp.path());
    for (name, dir) in [("one", one), ("grid", grid)] {
        let figs = tmp.path().join(format!("figs-{name}"));
        run(&[
            "ladder",
            "report",
            dir.to_str().unwrap(),
            "--format",
            "svg",
            "--out",
            figs.to_str().unwrap(),
        ]);
        for fig in std::fs::read_dir(&figs).unwrap() {
            let fig = fig.unwrap().path();
            let svg = std::fs::read_to_string(&fig).unwrap();
            // The page measures each text's box against the figure's.
            let page = tmp.path().join("measure.html");
            std::fs::write(
                &page,
                format!(
                    r#"<html><body style="margin:0">{svg}<pre id="out"></pre><script>
const s = document.querySelector('svg').getBoundingClientRect();
const out = [];
for (const t of document.querySelectorAll('svg text')) {{
  const r = t.getBoundingClientRect();
  if (r.left < s.left - 0.5 || r.right > s.right + 0.5 || r.top < s.top - 0.5 || r.bottom > s.bottom + 0.5)
    out.push(t.textContent);
}}
document.getElementById('out').textContent = 'outside: ' + JSON.stringify(out);
</script></body></html>"#
                ),
            )
            .unwrap();
            let o = browser(&chromium, &tmp.path().join("profile"))
                .arg("--dump-dom")
                .arg(format!("file://{}", page.display()))
                .output()
                .unwrap();
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
            let dom = String::from_utf8_lossy(&o.stdout);
            assert!(
                dom.contains("outside: []"),
                "{}: {}",
                fig.display(),
                dom.lines()
                    .find(|l| l.contains("outside: "))
                    .unwrap_or("no measurement")
            );
        }
    }
}
