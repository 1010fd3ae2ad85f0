//! The six error channels that partition every violation (paper §4.2, D.2).

use serde::{Deserialize, Serialize};

use crate::ladder::episode::StepId;

/// The six error channels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum Channel {
    /// A done step executed without authorization.
    ReExecution,
    /// A cancelled step executed.
    Superseded,
    /// A blocked step executed.
    Premature,
    /// An eligible requested step not executed.
    Omission,
    /// A step other than the requested one executed.
    Unrequested,
    /// An authorized re-execution not performed.
    RefusedRedo,
}

impl Channel {
    /// All channels in report order.
    pub const ALL: [Channel; 6] = [
        Channel::ReExecution,
        Channel::Superseded,
        Channel::Premature,
        Channel::Omission,
        Channel::Unrequested,
        Channel::RefusedRedo,
    ];

    /// snake_case name.
    pub fn name(self) -> &'static str {
        match self {
            Channel::ReExecution => "re_execution",
            Channel::Superseded => "superseded",
            Channel::Premature => "premature",
            Channel::Omission => "omission",
            Channel::Unrequested => "unrequested",
            Channel::RefusedRedo => "refused_redo",
        }
    }
}

/// Violation counts per channel.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChannelCounts {
    pub re_execution: u32,
    /// Superseded executions.
    pub superseded: u32,
    /// Premature executions.
    pub premature: u32,
    pub omission: u32,
    /// Unrequested executions.
    pub unrequested: u32,
    pub refused_redo: u32,
}

impl ChannelCounts {
    /// Adds one violation.
    pub fn add(&mut self, c: Channel) {
        *self.get_mut(c) += 1;
    }

    /// Count of one channel.
    pub fn get(&self, c: Channel) -> u32 {
        match c {
            Channel::ReExecution => self.re_execution,
            Channel::Superseded => self.superseded,
            Channel::Premature => self.premature,
            Channel::Omission => self.omission,
            Channel::Unrequested => self.unrequested,
            Channel::RefusedRedo => self.refused_redo,
        }
    }

    fn get_mut(&mut self, c: Channel) -> &mut u32 {
        match c {
            Channel::ReExecution => &mut self.re_execution,
            Channel::Superseded => &mut self.superseded,
            Channel::Premature => &mut self.premature,
            Channel::Omission => &mut self.omission,
            Channel::Unrequested => &mut self.unrequested,
            Channel::RefusedRedo => &mut self.refused_redo,
        }
    }

    /// Sum over channels.
    pub fn total(&self) -> u32 {
        Channel::ALL.iter().map(|c| self.get(*c)).sum()
    }
}

impl std::ops::AddAssign for ChannelCounts {
    fn add_assign(&mut self, o: ChannelCounts) {
        for c in Channel::ALL {
            *self.get_mut(c) += o.get(c);
        }
    }
}

/// One violation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Violation {
    pub channel: Channel,
    /// The step concerned.
    pub step: StepId,
}
