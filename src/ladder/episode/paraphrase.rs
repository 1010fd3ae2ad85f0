//! Held-out phrasings (paper A.5): every ask, premature and redo wording
//! rewritten by a model, written to the tier-2 cache the generator reads.
//!
//! Rewrite k of a family rewrites the template's wording k, so tier 2 keeps
//! tier 0's assignment. Sampling is seeded per (template, family, k,
//! attempt); a rewrite that is empty, repeats another wording of the family
//! or carries a work order is drawn again, at most twelve times.

use std::collections::BTreeMap;

use super::domain::{Domain, Family, Template};
use super::generator::{ParaphraseCache, Rewrites, CACHE_VERSION};
use crate::backend::shared::Client;
use crate::backend::{BackendError, ChatRequest, Message, Role};
use crate::ladder::prompts as p;

/// Rewriter settings.
#[derive(Debug, Clone, Copy)]
pub struct RewriteOptions {
    /// Sampling temperature (the paper: 0.7).
    pub temperature: f32,
    /// Base seed.
    pub seed: u64,
    /// Requests in flight at once.
    pub concurrency: usize,
}

/// Small models often echo the original; each attempt draws a new sample.
const ATTEMPTS: u64 = 12;

/// Why one family of one template got no rewrites.
#[derive(Debug, thiserror::Error)]
pub enum FamilyError {
    #[error("{slug} {family}")]
    Backend {
        slug: String,
        family: Family,
        #[source]
        source: BackendError,
    },
    #[error("{slug} {family} #{k}: no usable distinct rewrite in {ATTEMPTS} attempts")]
    NoRewrite {
        slug: String,
        family: Family,
        k: usize,
    },
}

/// The families that failed; every failure is reported, not just the first.
#[derive(Debug, thiserror::Error)]
#[error("{} of {total} families failed: {}", .failures.len(), .failures.iter().map(|e| crate::one_line(e)).collect::<Vec<_>>().join("; "))]
pub struct RewriteError {
    pub failures: Vec<FamilyError>,
    pub total: usize,
}

/// Cleans a model reply into a single request line, or None if unusable.
pub fn clean(reply: &str) -> Option<String> {
    let line = reply.lines().map(str::trim).find(|l| !l.is_empty())?;
    let line = line
        .strip_prefix("Request:")
        .or_else(|| line.strip_prefix("Rewritten request:"))
        .unwrap_or(line)
        .trim();
    let line = line.trim_matches(|c| matches!(c, '"' | '\'' | '`' | '“' | '”' | '*'));
    let line = line.trim_end_matches(['.', '!', ' ']).trim();
    let ok = !line.is_empty() && line.len() <= 300 && !line.contains('#');
    ok.then(|| line.to_string())
}

/// Writes the rewrites of every template of `domains` through the shared model.
pub fn rewrite(
    client: &Client,
    model_name: &str,
    domains: &[Domain],
    opts: RewriteOptions,
) -> Result<ParaphraseCache, RewriteError> {
    let jobs: Vec<(&Template, Family)> = domains
        .iter()
        .flat_map(|d| d.templates().iter())
        .flat_map(|t| Family::ALL.map(|f| (t, f)))
        .collect();
    // A job's index seeds its rewrites.
    let numbered: Vec<(u64, &Template, Family)> = jobs
        .iter()
        .enumerate()
        .map(|(i, &(t, f))| (i as u64, t, f))
        .collect();
    let results = crate::rundir::parallel(&numbered, opts.concurrency, |&(i, t, f)| {
        rewrite_family(client, t, f, opts, i)
    });
    let mut templates: BTreeMap<String, Rewrites> = BTreeMap::new();
    let mut failures = Vec::new();
    for (&(t, f), r) in jobs.iter().zip(results) {
        match r {
            Ok(v) => *templates.entry(t.slug.clone()).or_default().family_mut(f) = v,
            Err(e) => failures.push(e),
        }
    }
    if !failures.is_empty() {
        return Err(RewriteError {
            failures,
            total: jobs.len(),
        });
    }
    Ok(ParaphraseCache {
        version: CACHE_VERSION.to_string(),
        model: model_name.to_string(),
        templates,
    })
}

fn rewrite_family(
    client: &Client,
    t: &Template,
    f: Family,
    opts: RewriteOptions,
    job: u64,
) -> Result<Vec<String>, FamilyError> {
    let backend = |source| FamilyError::Backend {
        slug: t.slug.clone(),
        family: f,
        source,
    };
    let session = client.open().map_err(backend)?;
    let originals = t.family(f);
    let mut got: Vec<String> = Vec::new();
    for (k, wording) in originals.iter().enumerate() {
        let mut found = None;
        for attempt in 0..ATTEMPTS {
            let req = ChatRequest {
                messages: vec![Message::new(
                    Role::User,
                    p::paraphrase_prompt(&t.canonical, wording),
                )],
                max_tokens: 80,
                stop: Vec::new(),
                thinking: false,
                temperature: opts.temperature,
                seed: opts.seed ^ (job << 16) ^ ((k as u64) << 8) ^ attempt,
                tools: Vec::new(),
                logprobs: None,
                constraint: None,
                prompt_text: None,
                prompt_ids: None,
                prompt_logprobs: None,
                sampling: Default::default(),
            };
            let reply = session.chat(req).map_err(backend)?;
            if let Some(c) = clean(&reply.content) {
                let fresh = !got.iter().any(|g| g.eq_ignore_ascii_case(&c))
                    && !originals.iter().any(|o| o.eq_ignore_ascii_case(&c));
                if fresh {
                    found = Some(c);
                    break;
                }
            }
        }
        got.push(found.ok_or_else(|| FamilyError::NoRewrite {
            slug: t.slug.clone(),
            family: f,
            k,
        })?);
    }
    Ok(got)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cleaning() {
        assert_eq!(
            clean("Request: \"Please place the order now.\"\nextra").as_deref(),
            Some("Please place the order now")
        );
        assert_eq!(
            clean("\n\n  Get the PO out the door!  ").as_deref(),
            Some("Get the PO out the door")
        );
        assert_eq!(clean("Do it (#W1234)"), None);
        assert_eq!(clean("   "), None);
    }
}
