//! What the probe suites share: an episode at S = 10, ρ = 0.15 in a
//! protocol, and one scripted episode-arm run with the oracle parts.

use statebench::ladder::arms::Arm;
use statebench::ladder::episode::domain::Domain;
use statebench::ladder::episode::generator::generate;
use statebench::ladder::episode::{Episode, EpisodeConfig, Protocol};
use statebench::ladder::parts::scripted::{OracleMatcher, Scripted};
use statebench::ladder::parts::MemoryParts;
use statebench::ladder::run::runner::{
    run_episode, Compiled, EpisodeRecord, RunOptions, TurnRecord,
};

pub fn episode(domain: Domain, protocol: Protocol, seed: u64) -> Episode {
    let mut c = EpisodeConfig::paper(domain, 10, 0.15, seed);
    c.settings.protocol = protocol;
    generate(&c, None).unwrap()
}

pub fn run(
    ep: &Episode,
    arm: Arm,
    agent: Scripted,
    opts: RunOptions,
) -> (EpisodeRecord, Vec<TurnRecord>) {
    let mut agent = agent;
    run_episode(
        ep,
        arm,
        &mut agent,
        &mut OracleMatcher,
        &mut MemoryParts::scripted(),
        Some(&Compiled::oracle(ep)),
        &opts,
    )
}
