//! Probes beyond the paper: the gaps its Limitations name, measured with the
//! same arms, the same scorer and the same statistics. Each is off unless a
//! cell asks for it, so every other result stays as it was.
//!
//! - [`spoof`]: forged state in the scripted user's own text;
//! - [`faults`]: tool calls that fail with a transient error;
//! - [`escalation`]: a refusal the agent may ask the user to authorize.

pub mod escalation;
pub mod faults;
pub mod spoof;
