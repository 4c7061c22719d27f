//! The tuning campaign: measurement log, workers, resume, shards, merge and selection.

pub mod emit;
pub mod log;
pub mod merge;
pub mod run;
pub mod select;
pub mod worker;
