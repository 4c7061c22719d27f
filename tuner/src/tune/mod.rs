//! The tuning campaign: measurement log, workers, resume, shards, merge, selection, and
//! replay of search strategies against a measurement log.

pub mod emit;
pub mod log;
pub mod merge;
pub mod moe;
pub mod policy;
pub mod race;
pub mod race_replay;
pub mod replay;
pub mod run;
pub mod select;
pub mod worker;
