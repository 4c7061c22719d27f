//! The tuning campaign: measurement log, workers, resume, shards, merge and selection.

pub mod log;
