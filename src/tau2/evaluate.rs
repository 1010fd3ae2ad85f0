//! τ²'s airline evaluation: the database the agent left against the one
//! the gold actions leave, the facts the agent had to tell, and pass^k.

use super::db::FlightDb;
use super::record::{CallRecord, Reward, Termination};
use super::task::Task;
use super::tools;

/// Whether τ² scores an episode that ended so. A conversation cut short
/// (step or error limit, a failed model call) scores 0.
pub fn scored(termination: Termination) -> bool {
    matches!(
        termination,
        Termination::UserStop | Termination::Transfer | Termination::OutOfScope
    )
}

/// The reward of an episode that ended with `termination`: 0 (nothing
/// checked) when τ² would not score it, else [`evaluate`].
pub fn evaluate_episode(
    task: &Task,
    initial: &FlightDb,
    termination: Termination,
    calls: &[CallRecord],
    agent_texts: &[String],
) -> Reward {
    if scored(termination) {
        return evaluate(task, initial, calls, agent_texts);
    }
    Reward {
        reward: 0.0,
        db_match: None,
        communicated: Vec::new(),
    }
}

/// Scores one episode as τ² does: the agent's executed writes replayed in
/// order on a fresh copy of `initial` (reads change nothing, so τ² skips
/// them; a write that failed fails again the same way), the gold actions on
/// another (their errors ignored), the two DB hashes compared; each
/// COMMUNICATE string looked for in the agent's messages. The reward is the
/// product over the task's reward basis (`DB`, `COMMUNICATE`; the airline
/// tasks have no environment assertions, so `ENV_ASSERTION` counts 1).
pub fn evaluate(
    task: &Task,
    initial: &FlightDb,
    calls: &[CallRecord],
    agent_texts: &[String],
) -> Reward {
    let basis = &task.criteria.reward_basis;
    let db_match = basis
        .iter()
        .any(|b| b == "DB")
        .then(|| db_matches(task, initial, calls));
    let communicated: Vec<bool> = task
        .criteria
        .communicate_info
        .iter()
        .map(|info| communicated(info, agent_texts))
        .collect();
    let mut reward = 1.0;
    if db_match == Some(false) {
        reward = 0.0;
    }
    if basis.iter().any(|b| b == "COMMUNICATE") && communicated.contains(&false) {
        reward = 0.0;
    }
    Reward {
        reward,
        db_match,
        communicated,
    }
}

/// The database after the agent's executed writes hashes as the one after
/// the gold actions.
pub fn db_matches(task: &Task, initial: &FlightDb, calls: &[CallRecord]) -> bool {
    let mut predicted = initial.clone();
    for c in calls
        .iter()
        .filter(|c| c.executed && tools::is_write(&c.name))
    {
        let _ = tools::call(&mut predicted, &c.name, &c.arguments);
    }
    gold_db(task, initial).hash() == predicted.hash()
}

/// `initial` after the task's gold actions. A data directory whose gold
/// actions fail to replay is refused when it is read (`task::check_gold`),
/// so no error is dropped here.
pub fn gold_db(task: &Task, initial: &FlightDb) -> FlightDb {
    let mut gold = initial.clone();
    for a in &task.criteria.actions {
        let replayed = tools::call(&mut gold, &a.name, &a.arguments);
        debug_assert!(
            replayed.is_ok(),
            "task {}: {} was checked at load",
            task.id,
            a.action_id
        );
    }
    gold
}

/// τ²'s COMMUNICATE check: `info`, lower-cased, inside some agent message
/// lower-cased with its commas removed.
pub fn communicated(info: &str, agent_texts: &[String]) -> bool {
    let needle = info.to_lowercase();
    agent_texts
        .iter()
        .any(|t| t.to_lowercase().replace(',', "").contains(&needle))
}

/// pass^k for one task: the chance that k trials drawn without replacement
/// from `trials` all succeed, C(successes, k) / C(trials, k). None when
/// there are fewer than k trials (τ² refuses those).
pub fn pass_hat_k(successes: usize, trials: usize, k: usize) -> Option<f64> {
    if trials < k || successes > trials {
        return None;
    }
    // Π (successes - i) / (trials - i) over i < k: the ratio of the two
    // binomials without forming either.
    let mut p = 1.0;
    for i in 0..k {
        if successes < i + 1 {
            return Some(0.0);
        }
        p *= (successes - i) as f64 / (trials - i) as f64;
    }
    Some(p)
}
