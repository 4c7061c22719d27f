//! Search over kernel configurations: spaces as data, the analytic cost model (the crate's one
//! performance model) with its per-GPU data sheets and the decode-step roofline, and strategies
//! (replaying a strategy against a measurement log is `tune::replay`).

pub mod model;
pub mod roofline;
mod sheets;
pub mod space;
pub mod strategy;

use crate::problem::AType;
use crate::template::Family;

pub use model::{competitive_pipelines, Bound, CostModel, DeviceModel, Estimate, StreamFit};
pub use space::{Constraint, Param, ParamValues, PruneReport, SearchSpace, Violation};
pub use strategy::{
    Budget, Exhaustive, ModelGuided, ModelGuidedOptions, RandomSearch, Strategy, StrategyKind,
};

/// Errors of search-space construction and strategy selection.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SearchError {
    #[error("parameter {0} has no value list")]
    MissingParam(&'static str),
    #[error("parameter {0} is listed twice")]
    DuplicateParam(&'static str),
    #[error("parameter {0} has an empty value list")]
    EmptyParam(&'static str),
    #[error("the {family} family has no configurations for {a_type}")]
    EmptySpace { family: Family, a_type: AType },
    #[error("unknown strategy {0:?} (expected exhaustive, random or model)")]
    UnknownStrategy(String),
}
