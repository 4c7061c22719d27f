//! The tuning campaign: measurement log, workers, resume, shards, merge and selection.

pub mod log;
pub mod run;
pub mod select;
pub mod worker;
