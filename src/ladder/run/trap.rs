//! The trap-turn probe of Appendix A.4, read from the logged turns: each
//! re-execution on a redo probe (a fresh work order for a finished step) is
//! split by whether its reply first says the step is done ("says done, then
//! books": the booking line written as a citation) or not ("books without
//! saying so": the step taken as a fresh order). No model is called; the
//! paper's counterfactual re-asks are a separate experiment. The ambiguous
//! probes booked per arm (Table 4) are read the same way.

use serde::{Deserialize, Serialize};

use super::runner::TurnRecord;
use crate::ladder::arms::decline::says_done;
use crate::ladder::episode::TurnKind;
use crate::ladder::score::Channel;

/// Redo probes and their re-executions, split by what the reply says.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TrapSplit {
    /// Redo-probe turns.
    pub probes: u32,
    /// Of those, turns that re-executed the finished step (primary scoring).
    pub re_executions: u32,
    /// Re-executions whose reply says the step is done, then books.
    pub says_done: u32,
    /// Re-executions whose reply books without saying so.
    pub silent: u32,
}

impl TrapSplit {
    /// The split of one logged turn (zero unless it is a redo probe).
    pub fn of_turn(t: &TurnRecord) -> TrapSplit {
        let (TurnKind::RedoProbe, Some(step)) = (t.kind, t.step) else {
            return TrapSplit::default();
        };
        let mut s = TrapSplit {
            probes: 1,
            ..TrapSplit::default()
        };
        let redo = t
            .violations
            .iter()
            .any(|v| v.channel == Channel::ReExecution && v.step == step);
        if !redo {
            return s;
        }
        s.re_executions = 1;
        // The reply that carried the executed booking.
        let call = t
            .bookings
            .iter()
            .find(|b| b.executed && b.step == Some(step))
            .map_or(0, |b| usize::from(b.call));
        let reply = t.replies.get(call).map(String::as_str).unwrap_or("");
        if says_done(reply, &step.to_string()) {
            s.says_done = 1;
        } else {
            s.silent = 1;
        }
        s
    }
}

/// What the report reads from one episode's turns: the trap-turn split and
/// the ambiguous probes (a filler naming two eligible steps; correct: book
/// nothing) and how many of them the agent booked.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Probes {
    pub trap: TrapSplit,
    pub ambiguous: u32,
    pub ambiguous_booked: u32,
}

impl Probes {
    /// The turn kinds that hold probes (every other turn counts nothing).
    pub const KINDS: [TurnKind; 2] = [TurnKind::RedoProbe, TurnKind::Ambiguous];

    /// The probes of one logged turn.
    pub fn of_turn(t: &TurnRecord) -> Probes {
        let ambiguous = t.kind == TurnKind::Ambiguous;
        Probes {
            trap: TrapSplit::of_turn(t),
            ambiguous: u32::from(ambiguous),
            ambiguous_booked: u32::from(ambiguous && t.bookings.iter().any(|b| b.executed)),
        }
    }
}

impl std::ops::AddAssign for Probes {
    fn add_assign(&mut self, o: Probes) {
        self.trap += o.trap;
        self.ambiguous += o.ambiguous;
        self.ambiguous_booked += o.ambiguous_booked;
    }
}

impl std::ops::AddAssign for TrapSplit {
    fn add_assign(&mut self, o: TrapSplit) {
        self.probes += o.probes;
        self.re_executions += o.re_executions;
        self.says_done += o.says_done;
        self.silent += o.silent;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ladder::arms::Arm;
    use crate::ladder::episode::domain::Domain;
    use crate::ladder::episode::generator::generate;
    use crate::ladder::episode::EpisodeConfig;
    use crate::ladder::parts::scripted::{OracleMatcher, Scripted};
    use crate::ladder::parts::MemoryParts;
    use crate::ladder::run::replay::score_replies;
    use crate::ladder::run::runner::{run_episode, RunOptions};

    /// The perfect agent's replies, except that every redo probe books the
    /// finished step again, the given way.
    fn split(say: &str) -> TrapSplit {
        let ep = generate(
            &EpisodeConfig::paper(Domain::Procurement, 10, 0.15, 100),
            None,
        )
        .unwrap();
        let (_, perfect) = run_episode(
            &ep,
            Arm::Raw,
            &mut Scripted::Perfect,
            &mut OracleMatcher,
            &mut MemoryParts::scripted(),
            None,
            &RunOptions::default(),
        );
        let replies: Vec<String> = ep
            .turns
            .iter()
            .zip(&perfect)
            .map(|(t, r)| match (t.kind, t.step) {
                (TurnKind::RedoProbe, Some(v)) => {
                    let lead = say.replace("{step}", &v.to_string());
                    format!("{lead}\nref {}/{}", ep.step(v).code, t.work_order)
                }
                _ => r.replies[0].clone(),
            })
            .collect();
        let (_, turns) = score_replies(&ep, &replies, Arm::Raw).unwrap();
        let mut s = TrapSplit::default();
        for t in &turns {
            s += TrapSplit::of_turn(t);
        }
        s
    }

    #[test]
    fn re_executions_on_redo_probes_are_split_by_what_the_reply_says() {
        let cited = split("{step} is already complete; here is the booking line.");
        assert!(cited.probes > 0);
        assert_eq!(cited.re_executions, cited.probes);
        assert_eq!((cited.says_done, cited.silent), (cited.probes, 0));
        let fresh = split("Its prerequisites are complete, so {step} can go ahead.");
        assert_eq!((fresh.says_done, fresh.silent), (0, fresh.probes));
    }
}
