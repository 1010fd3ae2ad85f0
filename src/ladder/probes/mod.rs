//! Probes beyond the paper: the gaps its Limitations name, measured with the
//! same arms, the same scorer and the same statistics. Each is off unless a
//! cell asks for it, so every other result stays as it was.
//!
//! - [`spoof`]: forged state in the scripted user's own text.

pub mod spoof;
