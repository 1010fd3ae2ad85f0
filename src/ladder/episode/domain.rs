//! Domains: the template pools episodes are drawn from (paper §4.1, Appendix E.3).
//!
//! A domain is data: `data/domains/<name>.json` holds its phases, its 18
//! templates and its small talk, read once at first use. A template is one
//! step a project can contain, with every wording the scripted user needs.
//! Both pools have 18 templates and the same number per phase, so the
//! phase-consistent dependency sampler induces the same DAG-shape
//! distribution in either domain. Adding a domain is one more file and one
//! more line in [`Domain`].

use std::sync::OnceLock;

use serde::{Deserialize, Serialize};

/// Number of phases a pool is divided into; edges only go from an earlier phase to a later one.
pub const PHASES: u8 = 6;

/// One step template of a domain pool.
#[derive(Debug, Clone, Deserialize)]
pub struct Template {
    /// Stable identifier, unique across both domains (`proc_` / `rel_` prefix).
    pub slug: String,
    /// Phase 0..PHASES; a prerequisite always sits in a strictly earlier phase.
    pub phase: u8,
    /// Canonical wording used by the brief, the checklist and the matcher's step list.
    pub canonical: String,
    /// Three paraphrased imperative asks (no trailing punctuation, no work order).
    pub asks: [String; 3],
    /// Three wordings for an ask issued while the step is still blocked.
    pub premature: [String; 3],
    /// Three redo probes: a fresh imperative request for the step once it is finished.
    pub redo_probes: [String; 3],
    /// A status question about the step (the superseded cue uses it on the cancelled step).
    pub status_question: String,
    /// An explicit, reasoned order to perform the finished step again.
    pub legit_redo: String,
    /// Tool name used by the tool protocol (`ACTION {"tool": …}`).
    pub tool: String,
    /// The key noun every wording of the template carries and no other
    /// template or filler of the pool mentions (checked by the pool tests),
    /// so a request resolves to one step.
    pub key: String,
}

/// The wording families a template has three of (and tier 2 rewrites).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Family {
    Ask,
    Premature,
    Redo,
}

impl Family {
    pub const ALL: [Family; 3] = [Family::Ask, Family::Premature, Family::Redo];

    /// The name the rewrite cache uses.
    pub fn name(self) -> &'static str {
        match self {
            Family::Ask => "ask",
            Family::Premature => "premature",
            Family::Redo => "redo",
        }
    }
}

impl std::fmt::Display for Family {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl Template {
    /// The template's three wordings of a family.
    pub fn family(&self, f: Family) -> &[String; 3] {
        match f {
            Family::Ask => &self.asks,
            Family::Premature => &self.premature,
            Family::Redo => &self.redo_probes,
        }
    }
}

/// What a domain file holds.
#[derive(Debug, Deserialize)]
pub struct Pool {
    /// The domain's name, as the command line spells it.
    pub domain: String,
    pub about: String,
    /// What each phase is, in order.
    pub phases: Vec<String>,
    /// Templates ordered by phase.
    pub templates: Vec<Template>,
    /// Small-talk messages that neither ask for nor ask about any step.
    pub fillers: Vec<String>,
}

/// The two template pools.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Domain {
    /// Procurement of equipment (the paper's main domain).
    Procurement,
    /// Software release engineering (paper Appendix E.3).
    Release,
}

/// The domain files, in [`Domain`] order.
const FILES: [(&str, &str); 2] = [
    (
        "procurement",
        include_str!("../../../data/domains/procurement.json"),
    ),
    (
        "release",
        include_str!("../../../data/domains/release.json"),
    ),
];

fn pools() -> &'static [Pool] {
    static POOLS: OnceLock<Vec<Pool>> = OnceLock::new();
    POOLS.get_or_init(|| {
        FILES
            .iter()
            .map(|(name, text)| {
                // The files are compiled in and checked by the tests below.
                serde_json::from_str(text)
                    .unwrap_or_else(|e| panic!("data/domains/{name}.json: {e}"))
            })
            .collect()
    })
}

impl Domain {
    /// Both domains, in a fixed order.
    pub const ALL: [Domain; 2] = [Domain::Procurement, Domain::Release];

    /// The domain's pool, read from its file.
    pub fn pool(self) -> &'static Pool {
        &pools()[self as usize]
    }

    /// The domain's 18 templates, ordered by phase.
    pub fn templates(self) -> &'static [Template] {
        &self.pool().templates
    }

    /// Small-talk messages that ask for no step.
    pub fn fillers(self) -> &'static [String] {
        &self.pool().fillers
    }

    /// The name used on the command line and in logs.
    pub fn name(self) -> &'static str {
        FILES[self as usize].0
    }
}

impl std::str::FromStr for Domain {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Domain::ALL
            .into_iter()
            .find(|d| d.name() == s)
            .ok_or_else(|| format!("unknown domain '{s}' (expected procurement or release)"))
    }
}

impl std::fmt::Display for Domain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    fn pools() -> [(&'static [Template], &'static [String]); 2] {
        Domain::ALL.map(|d| (d.templates(), d.fillers()))
    }

    fn wordings(t: &Template) -> impl Iterator<Item = &String> {
        t.asks
            .iter()
            .chain(&t.premature)
            .chain(&t.redo_probes)
            .chain([&t.canonical, &t.status_question, &t.legit_redo])
    }

    fn is_snake(s: &str) -> bool {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
            && !s.starts_with('_')
            && !s.ends_with('_')
            && !s.contains("__")
    }

    fn has_step_id(s: &str) -> bool {
        s.split(|c: char| !c.is_ascii_alphanumeric()).any(|w| {
            let mut cs = w.chars();
            matches!(cs.next(), Some('s' | 'S')) && w.len() > 1 && cs.all(|c| c.is_ascii_digit())
        })
    }

    #[test]
    fn each_file_names_its_domain_and_phases() {
        for d in Domain::ALL {
            assert_eq!(d.pool().domain, d.name());
            assert_eq!(d.pool().phases.len(), PHASES as usize);
        }
    }

    #[test]
    fn eighteen_templates_three_per_phase_sorted() {
        for (pool, _) in pools() {
            assert_eq!(pool.len(), 18);
            for p in 0..PHASES {
                assert_eq!(pool.iter().filter(|t| t.phase == p).count(), 3, "phase {p}");
            }
            assert!(pool.windows(2).all(|w| w[0].phase <= w[1].phase));
            assert!(pool.iter().all(|t| t.phase < PHASES));
        }
    }

    #[test]
    fn per_phase_histograms_match() {
        let hist = |pool: &[Template]| {
            let mut h = [0usize; PHASES as usize];
            for t in pool {
                h[t.phase as usize] += 1;
            }
            h
        };
        assert_eq!(
            hist(Domain::Procurement.templates()),
            hist(Domain::Release.templates())
        );
    }

    #[test]
    fn slugs_and_tools_unique_and_prefixed() {
        let mut slugs = HashSet::new();
        let mut tools = HashSet::new();
        for (d, prefix) in [(Domain::Procurement, "proc_"), (Domain::Release, "rel_")] {
            let pool = d.templates();
            for t in pool.iter() {
                assert!(t.slug.starts_with(prefix), "{}", t.slug);
                assert!(is_snake(&t.slug), "{}", t.slug);
                assert!(is_snake(&t.tool), "{}", t.tool);
                assert!(slugs.insert(&t.slug), "duplicate slug {}", t.slug);
                assert!(tools.insert(&t.tool), "duplicate tool {}", t.tool);
            }
        }
        assert_eq!(slugs.len(), 36);
        assert_eq!(tools.len(), 36);
    }

    #[test]
    fn paper_wordings_present() {
        let canon = |d: Domain| {
            d.templates()
                .iter()
                .map(|t| t.canonical.as_str())
                .collect::<Vec<_>>()
        };
        let proc = canon(Domain::Procurement);
        for c in [
            "obtain the insurance certificate for the delivery",
            "sign the master service agreement",
            "negotiate final pricing with the selected vendor",
            "set up the project budget code in the finance system",
            "place the main equipment order",
            "send the RFQ to the shortlisted vendors",
        ] {
            assert!(proc.contains(&c), "{c}");
        }
        assert!(Domain::Procurement
            .templates()
            .iter()
            .any(|t| t.asks[0] == "Send the RFQ out to the shortlisted vendors"));
        let rel = canon(Domain::Release);
        for c in [
            "freeze the scope",
            "cut the release branch",
            "run the regression suite",
            "sign the artifacts",
            "start the canary rollout",
        ] {
            assert!(rel.iter().any(|r| r.starts_with(c)), "{c}");
        }
    }

    #[test]
    fn canonical_format() {
        for (pool, _) in pools() {
            for t in pool.iter() {
                let c = &t.canonical;
                assert!(c.starts_with(|ch: char| ch.is_ascii_lowercase()), "{c}");
                assert!(!c.ends_with(|ch: char| ch.is_ascii_punctuation()), "{c}");
                assert!(!c.contains('#') && !has_step_id(c), "{c}");
                assert!(!c.to_lowercase().contains("again"), "{c}");
            }
        }
    }

    #[test]
    fn request_wordings_format() {
        for (pool, _) in pools() {
            for t in pool.iter() {
                for w in t.asks.iter().chain(&t.premature).chain(&t.redo_probes) {
                    let lower = w.to_lowercase();
                    assert!(w.starts_with(|c: char| c.is_ascii_uppercase()), "{w}");
                    assert!(!w.ends_with(['.', '!', '?', ',', ';', ':']), "{w}");
                    assert!(!w.contains('#') && !has_step_id(w), "{w}");
                    assert!(!lower.contains("again"), "{w}");
                    assert!(!lower.contains("redo"), "{w}");
                    assert!(!lower.contains("re-"), "{w}");
                    assert!(!w.eq_ignore_ascii_case(&t.canonical), "{w}");
                }
            }
        }
    }

    #[test]
    fn status_and_legit_redo_format() {
        for (pool, _) in pools() {
            for t in pool.iter() {
                let q = &t.status_question;
                assert!(q.starts_with(|c: char| c.is_ascii_uppercase()), "{q}");
                assert!(q.ends_with('?') && !q.ends_with("??"), "{q}");
                assert!(!q.contains('#') && !has_step_id(q), "{q}");
                assert!(
                    !q.to_lowercase().contains("again") && !q.to_lowercase().contains("redo"),
                    "{q}"
                );
                let r = &t.legit_redo;
                assert!(r.starts_with(|c: char| c.is_ascii_uppercase()), "{r}");
                assert!(r.contains("again"), "{r}");
                assert!(
                    r.contains(", so please "),
                    "legit redo must state a reason: {r}"
                );
                assert!(!r.ends_with(['.', '!', '?']), "{r}");
                assert!(!r.contains('#') && !has_step_id(r), "{r}");
            }
        }
    }

    #[test]
    fn request_wordings_distinct() {
        let mut seen = HashSet::new();
        for (pool, _) in pools() {
            for t in pool.iter() {
                for w in t.asks.iter().chain(&t.premature).chain(&t.redo_probes) {
                    assert!(seen.insert(w.to_lowercase()), "duplicate wording {w}");
                }
            }
        }
        assert_eq!(seen.len(), 36 * 9);
    }

    #[test]
    fn key_nouns_resolve_uniquely() {
        for (pool, fillers) in pools() {
            for t in pool {
                for w in wordings(t) {
                    let lower = w.to_lowercase();
                    assert!(
                        lower.contains(&t.key),
                        "{} lacks key {:?}: {w}",
                        t.slug,
                        t.key
                    );
                    for o in pool.iter().filter(|o| o.slug != t.slug) {
                        assert!(
                            !lower.contains(&o.key),
                            "{} mentions {:?}: {w}",
                            t.slug,
                            o.key
                        );
                    }
                }
            }
            for f in fillers {
                let lower = f.to_lowercase();
                for t in pool {
                    assert!(!lower.contains(&t.key), "filler mentions {:?}: {f}", t.key);
                }
            }
        }
    }

    #[test]
    fn fillers_format_and_distinct() {
        let mut seen = HashSet::new();
        for (pool, fillers) in pools() {
            for f in fillers.iter() {
                assert!(f.starts_with(|c: char| c.is_ascii_uppercase()), "{f}");
                assert!(f.ends_with(['.', '!', '?']), "{f}");
                assert!(!f.contains('#') && !has_step_id(f), "{f}");
                assert!(seen.insert(f), "duplicate filler {f}");
                let lower = f.to_lowercase();
                assert!(!lower.contains("again") && !lower.contains("redo"), "{f}");
                for t in pool.iter() {
                    assert!(!lower.contains(&t.canonical), "{f}");
                }
            }
        }
        assert_eq!(seen.len(), 24);
    }
}
