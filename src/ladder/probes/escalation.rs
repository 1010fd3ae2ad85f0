//! An escalation path for refusals (`--escalation`, the gate arms): a
//! refusal's notice tells the agent it may ask the user to authorize the
//! work; the agent asks with an `ESCALATE <step>` line; the scripted user
//! grants or declines by schedule. A grant puts the step in α, the
//! explicit-redo set of the task state, for that request only, in the gate
//! module and in the ground truth alike; the gate then admits it as it
//! admits any authorized redo, and nothing else.
//!
//! With the probe, refusal notices come back within the turn (as on the
//! same-turn arm, D.3), so that the request is still open when the agent
//! asks. The user's schedule: only a finished step can be authorized (α
//! is a redo set), and the user grants it on a seeded half of the
//! requests, by episode and turn; it declines every other escalation (a
//! blocked, cancelled, unknown or unrequested step, which no
//! authorization makes correct).

use std::sync::OnceLock;

use regex::Regex;
use serde::{Deserialize, Serialize};

use crate::ladder::episode::{Episode, StepId};
use crate::rng::Rng;

/// An escalation as the turn record keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Escalation {
    /// The step the agent asked to be authorized.
    pub step: StepId,
    /// Whether the user granted it.
    pub granted: bool,
    /// The user's answer, as sent.
    pub answer: String,
}

/// The steps a reply asks to be authorized: `ESCALATE <step>` lines, the
/// step named by its id, completion code or tool.
pub fn asked(ep: &Episode, reply: &str) -> Vec<StepId> {
    static RE: OnceLock<Regex> = OnceLock::new();
    let re = RE.get_or_init(|| {
        Regex::new(r"(?i)\bescalate\b[\s:*`'\x22]*([A-Za-z0-9_\-]+)").expect("static regex")
    });
    let mut out = Vec::new();
    for c in re.captures_iter(reply) {
        let name = &c[1];
        let step = StepId::parse(name)
            .filter(|v| v.index() < ep.len())
            .or_else(|| ep.step_by_code(name))
            .or_else(|| ep.step_by_tool(name));
        if let Some(v) = step.filter(|v| !out.contains(v)) {
            out.push(v);
        }
    }
    out
}

/// The scripted user's answer to an escalation of `step` on `turn`, given
/// whether the step is finished (so that α can cover it).
pub fn grants(episode_seed: u64, turn: usize, finished: bool) -> bool {
    finished && Rng::stream(episode_seed, &format!("escalation {turn}")).chance(0.5)
}

/// Escalations asked, granted and declined, and admissions the gate made
/// of a finished step with no authorization on record.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EscalationCounts {
    pub asked: u32,
    pub granted: u32,
    pub declined: u32,
    /// Re-executions the gate admitted without an authorization the state
    /// recorded (the matcher's explicit redo or a granted escalation): 0
    /// by construction.
    pub wrongful: u32,
}

impl std::ops::AddAssign for EscalationCounts {
    fn add_assign(&mut self, o: EscalationCounts) {
        self.asked += o.asked;
        self.granted += o.granted;
        self.declined += o.declined;
        self.wrongful += o.wrongful;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ladder::episode::domain::Domain;
    use crate::ladder::episode::generator::generate;
    use crate::ladder::episode::EpisodeConfig;

    #[test]
    fn an_escalation_names_a_step_by_id_code_or_tool() {
        let ep = generate(
            &EpisodeConfig::paper(Domain::Procurement, 10, 0.15, 100),
            None,
        )
        .unwrap();
        let s = ep.step(StepId(3));
        let reply = format!(
            "Shall I? ESCALATE s2\n**ESCALATE** {}\nescalate: `{}`\nESCALATE s2\nESCALATE s40",
            s.code, s.tool
        );
        assert_eq!(asked(&ep, &reply), vec![StepId(1), StepId(3)]);
        assert!(asked(&ep, "I could escalate this if you like.").is_empty());
    }

    #[test]
    fn the_schedule_grants_finished_steps_on_about_half_the_turns() {
        let n = (0..400).filter(|&t| grants(9, t, true)).count();
        assert!((150..250).contains(&n), "{n}");
        assert!((0..400).all(|t| !grants(9, t, false)));
        assert_eq!(grants(9, 17, true), grants(9, 17, true));
    }
}
