//! Plain tables rendered as aligned text, Markdown or HTML: every study's
//! reports write their tables through this one type.
//!
//! Layer: a leaf; it uses nothing else of the crate, and any layer may use it.

use std::fmt::Write as _;

/// A plain table: a header and rows of cells, each row as long as the header.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Table {
    pub head: Vec<String>,
    pub rows: Vec<Vec<String>>,
}

impl Table {
    /// An empty table with this header.
    pub fn new<S: AsRef<str>>(head: &[S]) -> Table {
        Table {
            head: head.iter().map(|h| h.as_ref().to_string()).collect(),
            rows: Vec::new(),
        }
    }

    /// Appends a row.
    pub fn row(&mut self, cells: Vec<String>) {
        debug_assert_eq!(cells.len(), self.head.len(), "a row as long as the header");
        self.rows.push(cells);
    }

    /// Columns aligned with spaces, for a terminal.
    pub fn text(&self) -> String {
        let w: Vec<usize> = (0..self.head.len())
            .map(|i| {
                self.rows
                    .iter()
                    .map(|r| r[i].chars().count())
                    .chain([self.head[i].chars().count()])
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let line = |r: &[String]| {
            r.iter()
                .enumerate()
                .map(|(i, c)| format!("{c:<width$}", width = w[i]))
                .collect::<Vec<_>>()
                .join("  ")
                .trim_end()
                .to_string()
        };
        let mut s = line(&self.head) + "\n";
        for r in &self.rows {
            s += &line(r);
            s.push('\n');
        }
        s
    }

    /// An HTML `<table>`, cells escaped.
    pub fn html(&self) -> String {
        let esc = |c: &str| {
            c.replace('&', "&amp;")
                .replace('<', "&lt;")
                .replace('>', "&gt;")
        };
        let mut s = String::from("<table>\n<thead><tr>");
        for h in &self.head {
            let _ = write!(s, "<th>{}</th>", esc(h));
        }
        s += "</tr></thead>\n<tbody>\n";
        for r in &self.rows {
            s += "<tr>";
            for c in r {
                let _ = write!(s, "<td>{}</td>", esc(c));
            }
            s += "</tr>\n";
        }
        s + "</tbody>\n</table>\n"
    }

    /// A Markdown table.
    pub fn md(&self) -> String {
        let mut s = format!("| {} |\n", self.head.join(" | "));
        s += &format!("|{}\n", " --- |".repeat(self.head.len()));
        for r in &self.rows {
            s += &format!("| {} |\n", r.join(" | "));
        }
        s
    }
}

/// A value as its JSON spells it, without quotes (ρ = 1 reads `1.0`): how
/// a configuration value reads in a table, a cell's name and its pairing.
pub fn field<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_string(v)
        .unwrap_or_default()
        .trim_matches('"')
        .to_string()
}
