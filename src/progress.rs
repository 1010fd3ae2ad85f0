//! How far a long run has got, on stderr: a bar on a terminal; elsewhere
//! (CI and Slurm logs, `nohup`), where a bar draws nothing, a line about
//! once a minute with what is done, the rate and the time left.
//!
//! Layer: a leaf; it uses nothing else of the crate, and any layer may use it.

use std::io::IsTerminal;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

/// Seconds between progress lines when stderr is not a terminal, unless
/// `STATEBENCH_PROGRESS_SECS` says otherwise.
pub const LINE_EVERY_SECS: u64 = 60;

/// A run's progress over `unit`s (episode-arms, calls).
pub struct Meter {
    bar: ProgressBar,
    state: Mutex<Lines>,
    unit: &'static str,
}

/// What the next progress line (or the bar's message) reports.
struct Lines {
    /// Between lines; `None` draws a bar or nothing.
    every: Option<Duration>,
    /// The position the last line reported.
    shown: u64,
    started: Instant,
    last: Instant,
    len: u64,
    pos: u64,
    /// Units already done when the run started (a resume's): not counted
    /// in the rate.
    resumed: u64,
    msg: String,
}

impl Meter {
    /// A meter shown when `show` is true.
    pub fn new(show: bool, unit: &'static str) -> Self {
        let terminal = std::io::stderr().is_terminal();
        let bar = if show && terminal {
            let bar = ProgressBar::new(0);
            bar.set_style(
                ProgressStyle::with_template(&format!(
                    "{{bar:40}} {{pos}}/{{len}} {unit}  {{msg}}  eta {{eta}}"
                ))
                .expect("a valid template"),
            );
            bar
        } else {
            ProgressBar::hidden()
        };
        let every = (show && !terminal).then(|| {
            let secs = std::env::var("STATEBENCH_PROGRESS_SECS")
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(LINE_EVERY_SECS);
            Duration::from_secs(secs)
        });
        let now = Instant::now();
        Meter {
            bar,
            state: Mutex::new(Lines {
                every,
                shown: 0,
                started: now,
                last: now,
                len: 0,
                pos: 0,
                resumed: 0,
                msg: String::new(),
            }),
            unit,
        }
    }

    fn with_lines(&self, f: impl FnOnce(&mut Lines)) {
        if let Ok(mut l) = self.state.lock() {
            f(&mut l);
        }
    }

    pub fn set_length(&self, len: u64) {
        self.bar.set_length(len);
        self.with_lines(|l| l.len = len);
    }

    /// Where the run starts (units a resume found done).
    pub fn set_position(&self, pos: u64) {
        self.bar.set_position(pos);
        self.with_lines(|l| {
            l.pos = pos;
            l.resumed = pos;
        });
    }

    /// What follows the rate (tokens a second).
    pub fn set_message(&self, msg: String) {
        self.with_lines(|l| l.msg = msg);
    }

    /// One more unit done; a line when one is due.
    pub fn inc(&self) {
        let unit = self.unit;
        let mut rate = String::new();
        self.with_lines(|l| {
            l.pos += 1;
            if l.every.is_some_and(|every| l.last.elapsed() >= every) {
                l.last = Instant::now();
                l.shown = l.pos;
                eprintln!("{}", l.line(unit));
            }
            rate = format!("{:.0} {unit}/h  {}", l.per_hour(), l.msg);
        });
        self.bar.set_message(rate);
        self.bar.inc(1);
    }

    /// A line of its own (above the bar on a terminal).
    pub fn println(&self, line: impl AsRef<str>) {
        let lines = self.state.lock().is_ok_and(|l| l.every.is_some());
        if lines {
            eprintln!("{}", line.as_ref());
        } else {
            self.bar.println(line.as_ref());
        }
    }

    /// Clears the bar, or writes the last line.
    pub fn finish(&self) {
        self.bar.finish_and_clear();
        let unit = self.unit;
        self.with_lines(|l| {
            if l.every.is_some() && l.pos > l.shown.max(l.resumed) {
                eprintln!("{}", l.line(unit));
            }
        });
    }
}

impl Lines {
    /// Units run an hour (a resume's are not counted).
    fn per_hour(&self) -> f64 {
        let ran = self.pos.saturating_sub(self.resumed);
        ran as f64 / self.started.elapsed().as_secs_f64().max(1e-9) * 3600.0
    }

    fn line(&self, unit: &str) -> String {
        let secs = self.started.elapsed().as_secs_f64();
        let ran = self.pos.saturating_sub(self.resumed);
        let per_hour = self.per_hour();
        let left = self.len.saturating_sub(self.pos);
        let eta = if ran == 0 {
            "unknown".to_string()
        } else {
            clock(left as f64 / ran as f64 * secs)
        };
        let msg = if self.msg.is_empty() {
            String::new()
        } else {
            format!("  {}", self.msg)
        };
        format!(
            "progress: {}/{} {unit} ({:.1}%), {per_hour:.0} {unit}/h, {} elapsed, eta {eta}{msg}",
            self.pos,
            self.len,
            100.0 * self.pos as f64 / self.len.max(1) as f64,
            clock(secs),
        )
    }
}

/// `1h02m`, `3m05s`, `12s`.
fn clock(secs: f64) -> String {
    let s = secs.round() as u64;
    match (s / 3600, s % 3600 / 60, s % 60) {
        (0, 0, s) => format!("{s}s"),
        (0, m, s) => format!("{m}m{s:02}s"),
        (h, m, _) => format!("{h}h{m:02}m"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_say_done_rate_and_time_left() {
        assert_eq!(clock(5.0), "5s");
        assert_eq!(clock(185.0), "3m05s");
        assert_eq!(clock(3720.0), "1h02m");
        let l = Lines {
            every: Some(Duration::ZERO),
            shown: 0,
            started: Instant::now() - Duration::from_secs(60),
            last: Instant::now(),
            len: 100,
            pos: 30,
            resumed: 10,
            msg: "3.0 tok/s".into(),
        };
        let line = l.line("episode-arms");
        // 20 run in a minute: 1,200 an hour, 70 left take 3.5 minutes.
        assert!(line.starts_with("progress: 30/100 episode-arms (30.0%), 1200 episode-arms/h, 1m00s elapsed, eta 3m30s  3.0 tok/s"), "{line}");
    }
}
