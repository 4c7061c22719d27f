//! Errors of shape files and config derivation: every variant names the file (origin) it came from.

use std::fmt;
use std::path::PathBuf;

/// Everything that can go wrong reading, checking or deriving a shape file.
///
/// `origin` is the file path (or a label such as `"<embedded shapes/glm5.ron>"`) the text came from.
#[derive(Debug, thiserror::Error)]
pub enum ShapeError {
    // The OS error is in the message and deliberately not a `source`: printed with its chain
    // (`{:#}`), a source would repeat it.
    #[error("{}: cannot read: {error}", path.display())]
    Read { path: PathBuf, error: std::io::Error },

    #[error(
        "{origin}: this is a dispatch table, not a shape file (a shape file lists a model's GEMM \
         shapes, like shapes/glm5.ron; a table is checked with `fp4tune table --check`)"
    )]
    DispatchTable { origin: String },

    #[error("{origin}:{line}:{column}: malformed RON: {message}")]
    Ron { origin: String, line: usize, column: usize, message: String },

    #[error(
        "{origin}: unsupported schema_version {found} (this fp4tune reads schema_version {expected})"
    )]
    SchemaVersion { origin: String, found: u32, expected: u32 },

    #[error("{origin}: {at}: {reason}")]
    Invalid { origin: String, at: String, reason: InvalidReason },

    /// A config's dense layers do not shard into valid shapes while its MoE layers do.
    #[error(
        "{origin}: {at}: {reason} (a dense layer's shape; `fp4tune shapes --moe-only` derives the \
         MoE layers' shapes alone)"
    )]
    DenseLayers { origin: String, at: String, reason: InvalidReason },

    #[error("{origin}: no shape set named {name:?} (available: {})", available.join(", "))]
    UnknownSet { origin: String, name: String, available: Vec<String> },

    #[error("{origin}:{line}:{column}: malformed JSON: {message}")]
    Json { origin: String, line: usize, column: usize, message: String },

    #[error("{origin}: config has no \"model_type\" string")]
    NoModelType { origin: String },

    #[error(
        "{origin}: unsupported model_type {model_type:?} (supported: {})",
        super::hf::SUPPORTED_MODEL_TYPES.join(", ")
    )]
    UnknownModelType { origin: String, model_type: String },

    #[error("{origin}: missing key {key:?} (needed for model_type {model_type:?})")]
    MissingKey { origin: String, model_type: String, key: String },

    #[error("{origin}: key {key:?} must be {expected}, found {found}")]
    BadValue { origin: String, key: String, expected: &'static str, found: String },

    #[error("{origin}: tp={tp} ep={ep}: {reason}")]
    Parallelism { origin: String, tp: u32, ep: u32, reason: ParallelismReason },
}

/// Why a loaded or derived shape file breaks a rule of the schema.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InvalidReason {
    /// The file has no shape sets at all.
    NoSets,
    /// Two shape sets share a name.
    DuplicateSet,
    /// A set or shape name that is empty or holds a comma, a quote or a control character (names
    /// become CSV fields, file names and report lines).
    BadName,
    /// A shape set lists no GEMMs.
    NoShapes,
    /// Two GEMMs of one set share a name.
    DuplicateShape,
    /// `tp` or `ep` is zero, or `ep` does not divide `tp`.
    BadParallelism { tp: u32, ep: u32 },
    /// `routed_experts` or `experts_per_token` is zero, or more experts per token than experts.
    BadRouting { routed_experts: u32, experts_per_token: u32 },
    /// N or K is zero.
    ZeroDim { dim: &'static str },
    /// K is not a multiple of the NVFP4 block size (16).
    KNotBlockMultiple { k: u32 },
    /// `count_per_layer` or `layers` is zero.
    ZeroCount { field: &'static str },
    /// The token-bucket list is empty.
    NoBuckets,
    /// A token bucket is zero.
    ZeroBucket,
    /// Token buckets must be strictly increasing; `prev` is followed by `next`.
    BucketsNotIncreasing { prev: u32, next: u32 },
    /// A size or count above its sane bound ([`super::MAX_DIM`], [`super::MAX_LAYERS`], ...).
    TooLarge { field: &'static str, value: u32, max: u32 },
}

impl fmt::Display for InvalidReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InvalidReason::NoSets => write!(f, "the file has no shape sets"),
            InvalidReason::DuplicateSet => write!(f, "another shape set has the same name"),
            InvalidReason::BadName => write!(
                f,
                "a name must be non-empty, without commas, quotes or control characters (it \
                 becomes a CSV field and part of file names)"
            ),
            InvalidReason::NoShapes => write!(f, "the set lists no GEMM shapes"),
            InvalidReason::DuplicateShape => {
                write!(f, "another shape of this set has the same name")
            }
            InvalidReason::BadParallelism { tp, ep } => {
                write!(f, "parallelism tp={tp} ep={ep}: both must be > 0 and ep must divide tp")
            }
            InvalidReason::BadRouting { routed_experts, experts_per_token } => write!(
                f,
                "routing {routed_experts} experts, {experts_per_token} per token: both must be > 0, \
                 experts_per_token <= routed_experts, routed_experts <= {} and experts_per_token \
                 <= {}",
                super::MAX_EXPERTS,
                super::MAX_EXPERTS_PER_TOKEN
            ),
            InvalidReason::ZeroDim { dim } => write!(f, "{dim} must be > 0"),
            InvalidReason::KNotBlockMultiple { k } => {
                write!(f, "k={k} is not a multiple of 16 (the NVFP4 scale block)")
            }
            InvalidReason::ZeroCount { field } => write!(f, "{field} must be > 0"),
            InvalidReason::NoBuckets => write!(f, "token_buckets is empty"),
            InvalidReason::ZeroBucket => write!(f, "token_buckets contains 0"),
            InvalidReason::BucketsNotIncreasing { prev, next } => write!(
                f,
                "token_buckets must be sorted and unique, but {prev} is followed by {next}"
            ),
            InvalidReason::TooLarge { field, value, max } => {
                write!(f, "{field}={value} is above the largest this fp4tune accepts ({max})")
            }
        }
    }
}

/// Why a requested (tp, ep) cannot shard a model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParallelismReason {
    /// TP is zero.
    ZeroTp,
    /// EP is zero.
    ZeroEp,
    /// EP must divide TP (the GPUs of one replica are `tp`; the MoE splits them into `ep` groups).
    EpNotDividingTp,
    /// EP does not divide the number of routed experts.
    EpNotDividingExperts { experts: u32 },
    /// The MoE tensor-parallel degree (tp / ep) does not divide an intermediate size.
    TpNotDividing { key: &'static str, size: u32, moe_tp: u32 },
}

impl fmt::Display for ParallelismReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ParallelismReason::ZeroTp => write!(f, "tp must be >= 1"),
            ParallelismReason::ZeroEp => write!(f, "ep must be >= 1"),
            ParallelismReason::EpNotDividingTp => write!(
                f,
                "ep must divide tp (as in SGLang, tp counts the GPUs of one replica and ep splits \
                 them into expert groups; EP8 on 8 GPUs is tp=8 ep=8)"
            ),
            ParallelismReason::EpNotDividingExperts { experts } => {
                write!(f, "ep does not divide the {experts} routed experts")
            }
            ParallelismReason::TpNotDividing { key, size, moe_tp } => write!(
                f,
                "the MoE tensor-parallel degree tp/ep = {moe_tp} does not divide {key} = {size}"
            ),
        }
    }
}
