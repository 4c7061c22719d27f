//! The tuning campaign: measurement log, workers (one per GPU), resume, shards, merge, selection, and
//! replay of search strategies against a measurement log.

pub mod assign;
pub mod emit;
#[cfg(test)]
pub(crate) mod fake_worker;
pub mod log;
pub mod merge;
pub mod moe;
pub mod planner;
pub mod policy;
pub mod race;
pub mod race_replay;
pub mod replay;
pub mod run;
pub mod select;
pub mod shard;
pub mod worker;

pub use run::gpus;
