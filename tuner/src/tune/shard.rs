//! Which slice of a campaign a process tunes (`--shard i/n`, or `--shard auto` from a batch
//! scheduler's array index), the file names that keep shards apart, and the manifest a shard
//! writes next to its log so that `fp4tune merge` can check the shards belong together and name
//! the missing ones.
//!
//! A shard's keys are chosen by [`super::assign::distribute`]: the campaign's keys in per-shape
//! bucket chains balanced by predicted cost, so every process computes the same partition and
//! the shards cover every key exactly once.

use crate::table::TableKey;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// Which slice of a campaign this process runs: shard `index` of `count` (0-based).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shard {
    pub index: u32,
    pub count: u32,
}

/// Most shards a campaign may have (a campaign of more shards than keys leaves shards idle; the
/// default shape set has 80 keys).
pub const MAX_SHARDS: u32 = 4096;

/// The scheduler variables `--shard auto` reads.
pub const SLURM_ID: &str = "SLURM_ARRAY_TASK_ID";
pub const SLURM_COUNT: &str = "SLURM_ARRAY_TASK_COUNT";
pub const SLURM_MIN: &str = "SLURM_ARRAY_TASK_MIN";
pub const SLURM_MAX: &str = "SLURM_ARRAY_TASK_MAX";
/// Kubernetes indexed Jobs export the completion index, not the completion count: the count
/// comes from this variable (set it to the Job's `completions`).
pub const K8S_INDEX: &str = "JOB_COMPLETION_INDEX";
pub const SHARD_COUNT: &str = "FP4TUNE_SHARD_COUNT";

/// Why a shard could not be determined (one line each, naming the variable at fault).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ShardError {
    #[error("--shard `{0}`: expected auto or i/n with 0 <= i < n <= {MAX_SHARDS} (e.g. 3/8)")]
    Syntax(String),
    #[error("--shard auto: {var}={count}: at most {MAX_SHARDS} shards")]
    TooMany { var: &'static str, count: u32 },
    #[error("--shard auto: {var}=`{value}` is not a non-negative integer")]
    NotANumber { var: &'static str, value: String },
    #[error("--shard auto: {var} is not set ({why})")]
    Missing { var: &'static str, why: &'static str },
    #[error("--shard auto: {var}=0: a campaign needs at least one shard")]
    ZeroCount { var: &'static str },
    #[error("--shard auto: {var}={value} gives shard index {index} (the index less the array's minimum, {SLURM_MIN}, under Slurm), not in 0..{count} ({count_var})")]
    OutOfRange { var: &'static str, value: u32, index: i64, count: u32, count_var: &'static str },
    #[error(
        "--shard auto: {SLURM_MIN}={min} and {SLURM_MAX}={max} span {span} indices but \
         {SLURM_COUNT}={count}: the array must be contiguous (e.g. --array=0-{last}, no step or list)"
    )]
    NotContiguous { min: u32, max: u32, span: i64, count: u32, last: u32 },
    #[error(
        "--shard auto: no scheduler array index in the environment ({SLURM_ID} for a Slurm array \
         job, {K8S_INDEX} for a Kubernetes indexed Job); use --shard i/n elsewhere"
    )]
    NoScheduler,
    #[error(
        "--shard auto: both {SLURM_ID} (Slurm) and {K8S_INDEX} (Kubernetes) are set: which \
         scheduler's index to take cannot be told; unset one, or use --shard i/n"
    )]
    TwoSchedulers,
}

/// `--shard`'s value: a fixed slice, or the scheduler's (read when the campaign starts).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShardArg {
    Auto,
    Fixed(Shard),
}

impl ShardArg {
    /// `auto` or `i/n`.
    pub fn parse(s: &str) -> Result<Self, ShardError> {
        if s.trim() == "auto" {
            Ok(Self::Auto)
        } else {
            Shard::parse(s).map(Self::Fixed)
        }
    }

    /// The shard: fixed, or from the process environment.
    pub fn resolve(self) -> Result<Shard, ShardError> {
        match self {
            Self::Fixed(s) => Ok(s),
            Self::Auto => Shard::from_env(|v| std::env::var(v).ok()),
        }
    }
}

impl Shard {
    pub fn all() -> Self {
        Self { index: 0, count: 1 }
    }

    /// Parse "i/n" (0 <= i < n).
    pub fn parse(s: &str) -> Result<Self, ShardError> {
        let err = || ShardError::Syntax(s.to_string());
        let (i, n) = s.split_once('/').ok_or_else(err)?;
        let index: u32 = i.trim().parse().map_err(|_| err())?;
        let count: u32 = n.trim().parse().map_err(|_| err())?;
        if count == 0 || index >= count || count > MAX_SHARDS {
            return Err(err());
        }
        Ok(Self { index, count })
    }

    /// The scheduler's array index and count, read through `get` (the process environment in
    /// the campaign, a map in tests). Slurm: `SLURM_ARRAY_TASK_ID` less `SLURM_ARRAY_TASK_MIN`
    /// (0 when absent) of `SLURM_ARRAY_TASK_COUNT`, the array contiguous. Kubernetes indexed
    /// Job: `JOB_COMPLETION_INDEX` of `FP4TUNE_SHARD_COUNT`.
    pub fn from_env(get: impl Fn(&str) -> Option<String>) -> Result<Self, ShardError> {
        let num = |var: &'static str| -> Result<Option<u32>, ShardError> {
            match get(var) {
                None => Ok(None),
                Some(v) => v
                    .trim()
                    .parse::<u32>()
                    .map(Some)
                    .map_err(|_| ShardError::NotANumber { var, value: v }),
            }
        };
        if get(SLURM_ID).is_some() && get(K8S_INDEX).is_some() {
            return Err(ShardError::TwoSchedulers);
        }
        let (id_var, id, count_var, count, min) = if let Some(id) = num(SLURM_ID)? {
            let count = num(SLURM_COUNT)?.ok_or(ShardError::Missing {
                var: SLURM_COUNT,
                why: "Slurm sets it for array jobs; is this an array task?",
            })?;
            let min = num(SLURM_MIN)?.unwrap_or(0);
            if count == 0 {
                return Err(ShardError::ZeroCount { var: SLURM_COUNT });
            }
            if let Some(max) = num(SLURM_MAX)? {
                let span = max as i64 - min as i64 + 1;
                if span != count as i64 {
                    return Err(ShardError::NotContiguous {
                        min,
                        max,
                        span,
                        count,
                        last: count - 1,
                    });
                }
            }
            (SLURM_ID, id, SLURM_COUNT, count, min)
        } else if let Some(index) = num(K8S_INDEX)? {
            let count = num(SHARD_COUNT)?.ok_or(ShardError::Missing {
                var: SHARD_COUNT,
                why: "Kubernetes does not export an indexed Job's completion count; set it to the Job's completions",
            })?;
            (K8S_INDEX, index, SHARD_COUNT, count, 0)
        } else {
            return Err(ShardError::NoScheduler);
        };
        if count == 0 {
            return Err(ShardError::ZeroCount { var: count_var });
        }
        if count > MAX_SHARDS {
            return Err(ShardError::TooMany { var: count_var, count });
        }
        let index = id as i64 - min as i64;
        if index < 0 || index >= count as i64 {
            return Err(ShardError::OutOfRange { var: id_var, value: id, index, count, count_var });
        }
        Ok(Self { index: index as u32, count })
    }

    /// The part of a file name that tells this shard's files apart: `shard-3-of-8`; `None` for
    /// the whole campaign (its files keep their one-GPU names).
    pub fn tag(&self) -> Option<String> {
        (self.count > 1).then(|| format!("shard-{}-of-{}", self.index, self.count))
    }

    /// `<stem>.shard-i-of-n.<ext>` for a shard, `<stem>.<ext>` for the whole campaign.
    pub fn file_name(&self, stem: &str, ext: &str) -> String {
        match self.tag() {
            Some(t) => format!("{stem}.{t}.{ext}"),
            None => format!("{stem}.{ext}"),
        }
    }

    /// The shard a file name written by [`Shard::file_name`] belongs to, if any.
    pub fn of_file_name(name: &str) -> Option<Self> {
        let at = name.rfind(".shard-")?;
        let rest = &name[at + ".shard-".len()..];
        let (i, rest) = rest.split_once("-of-")?;
        let n: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
        let (index, count) = (i.parse().ok()?, n.parse().ok()?);
        (index < count).then_some(Self { index, count })
    }
}

impl std::fmt::Display for Shard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

/// Version of the shard manifest this fp4tune writes and reads.
pub const MANIFEST_SCHEMA_VERSION: u32 = 1;

/// What a shard writes next to its log (`<log stem>.manifest.json`) before it measures and again
/// when it finishes: what merge checks shards against each other with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub schema_version: u32,
    pub shard: Shard,
    /// GPU model (driver name) and compute capability the shard ran on.
    pub device: String,
    pub compute_capability: (u32, u32),
    pub template_hash: String,
    /// Every key of the campaign (all shards), sorted: the shape set and buckets it tunes.
    pub campaign_keys: Vec<TableKey>,
    /// This shard's keys.
    pub keys: Vec<TableKey>,
    /// Set when the shard's campaign ran to its end (its table written).
    pub finished: bool,
    /// The shard's partial dispatch table (file name, in the manifest's folder).
    pub table: String,
}

#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    // The OS error is in the message, not a source (printed once).
    #[error("{}: {error}", path.display())]
    Io { path: PathBuf, error: std::io::Error },
    #[error("{}: not a shard manifest: {error}", path.display())]
    Parse { path: PathBuf, error: String },
    #[error("{}: shard manifest version {found}; this fp4tune reads version {MANIFEST_SCHEMA_VERSION}", path.display())]
    Version { path: PathBuf, found: u32 },
}

impl Manifest {
    /// The manifest path of the log at `log` (`x.shard-1-of-4.jsonl` -> `x.shard-1-of-4.manifest.json`).
    pub fn path_of_log(log: &Path) -> PathBuf {
        let name = log.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let stem = name.strip_suffix(".gz").unwrap_or(&name);
        let stem = stem.strip_suffix(".jsonl").unwrap_or(stem);
        log.with_file_name(format!("{stem}.manifest.json"))
    }

    /// Written atomically (a killed shard leaves the old manifest or the new one).
    pub fn save(&self, path: &Path) -> Result<(), ManifestError> {
        let io = |error| ManifestError::Io { path: path.to_path_buf(), error };
        let text = serde_json::to_string_pretty(self).expect("manifests serialize");
        crate::fsio::create_parent_dir(path).map_err(io)?;
        crate::fsio::write_atomic(path, text.as_bytes()).map_err(io)
    }

    /// `None` when there is no manifest at `path`.
    pub fn load(path: &Path) -> Result<Option<Self>, ManifestError> {
        let text = match crate::fsio::read_input(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(error) => return Err(ManifestError::Io { path: path.to_path_buf(), error }),
        };
        #[derive(Deserialize)]
        struct Version {
            schema_version: u32,
        }
        let parse = |error: serde_json::Error| ManifestError::Parse {
            path: path.to_path_buf(),
            error: error.to_string(),
        };
        let v: Version = serde_json::from_str(&text).map_err(parse)?;
        if v.schema_version != MANIFEST_SCHEMA_VERSION {
            return Err(ManifestError::Version {
                path: path.to_path_buf(),
                found: v.schema_version,
            });
        }
        serde_json::from_str(&text).map(Some).map_err(parse)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> =
            pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn explicit_shards_parse() {
        assert_eq!(Shard::parse("3/8").unwrap(), Shard { index: 3, count: 8 });
        for bad in ["2/2", "x/2", "1", "0/0", "-1/4", "1/x", "0/4097", "0/4294967295"] {
            assert!(Shard::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(Shard::parse("4095/4096").unwrap(), Shard { index: 4095, count: 4096 });
        let e = Shard::from_env(env(&[(K8S_INDEX, "0"), (SHARD_COUNT, "5000")])).unwrap_err();
        assert_eq!(e, ShardError::TooMany { var: SHARD_COUNT, count: 5000 });
        let both = [(SLURM_ID, "0"), (SLURM_COUNT, "2"), (K8S_INDEX, "1"), (SHARD_COUNT, "2")];
        assert_eq!(Shard::from_env(env(&both)).unwrap_err(), ShardError::TwoSchedulers);
        assert_eq!(ShardArg::parse("auto").unwrap(), ShardArg::Auto);
        assert_eq!(ShardArg::parse("0/2").unwrap(), ShardArg::Fixed(Shard { index: 0, count: 2 }));
    }

    #[test]
    fn slurm_arrays() {
        let s = Shard::from_env(env(&[(SLURM_ID, "5"), (SLURM_COUNT, "8")])).unwrap();
        assert_eq!(s, Shard { index: 5, count: 8 });
        // `--array=1-8`: the index is offset by the array's minimum.
        let s = Shard::from_env(env(&[
            (SLURM_ID, "8"),
            (SLURM_COUNT, "8"),
            (SLURM_MIN, "1"),
            (SLURM_MAX, "8"),
        ]))
        .unwrap();
        assert_eq!(s, Shard { index: 7, count: 8 });
        let e = Shard::from_env(env(&[(SLURM_ID, "x"), (SLURM_COUNT, "8")])).unwrap_err();
        assert!(e.to_string().contains("SLURM_ARRAY_TASK_ID=`x`"), "{e}");
        let e = Shard::from_env(env(&[(SLURM_ID, "8"), (SLURM_COUNT, "8")])).unwrap_err();
        assert!(matches!(e, ShardError::OutOfRange { index: 8, count: 8, .. }), "{e}");
        assert!(e.to_string().contains("SLURM_ARRAY_TASK_ID=8"), "{e}");
        let e = Shard::from_env(env(&[(SLURM_ID, "0"), (SLURM_COUNT, "0")])).unwrap_err();
        assert_eq!(e, ShardError::ZeroCount { var: SLURM_COUNT });
        let e = Shard::from_env(env(&[(SLURM_ID, "0")])).unwrap_err();
        assert!(e.to_string().contains("SLURM_ARRAY_TASK_COUNT is not set"), "{e}");
        // `--array=0-15:2`: 8 tasks over 16 indices.
        let e = Shard::from_env(env(&[
            (SLURM_ID, "2"),
            (SLURM_COUNT, "8"),
            (SLURM_MIN, "0"),
            (SLURM_MAX, "14"),
        ]))
        .unwrap_err();
        assert!(e.to_string().contains("contiguous"), "{e}");
        let e = Shard::from_env(env(&[(SLURM_ID, "0"), (SLURM_COUNT, "2"), (SLURM_MIN, "3")]))
            .unwrap_err();
        assert!(matches!(e, ShardError::OutOfRange { index: -3, .. }), "{e}");
        // Every message is one line.
        assert!(!e.to_string().contains('\n'));
    }

    #[test]
    fn kubernetes_indexed_jobs() {
        let s = Shard::from_env(env(&[(K8S_INDEX, "2"), (SHARD_COUNT, "4")])).unwrap();
        assert_eq!(s, Shard { index: 2, count: 4 });
        let e = Shard::from_env(env(&[(K8S_INDEX, "2")])).unwrap_err();
        assert!(e.to_string().contains("FP4TUNE_SHARD_COUNT is not set"), "{e}");
        let e = Shard::from_env(env(&[(K8S_INDEX, "4"), (SHARD_COUNT, "4")])).unwrap_err();
        assert!(e.to_string().contains("JOB_COMPLETION_INDEX=4"), "{e}");
        let e = Shard::from_env(env(&[(K8S_INDEX, "0"), (SHARD_COUNT, "0")])).unwrap_err();
        assert!(e.to_string().contains("FP4TUNE_SHARD_COUNT=0"), "{e}");
        let e = Shard::from_env(env(&[(K8S_INDEX, "0"), (SHARD_COUNT, "four")])).unwrap_err();
        assert!(e.to_string().contains("FP4TUNE_SHARD_COUNT=`four`"), "{e}");
        assert_eq!(Shard::from_env(env(&[])).unwrap_err(), ShardError::NoScheduler);
    }

    #[test]
    fn file_names_keep_shards_apart() {
        let s = Shard { index: 3, count: 8 };
        assert_eq!(
            s.file_name("nvidia-h200-w4a16", "jsonl"),
            "nvidia-h200-w4a16.shard-3-of-8.jsonl"
        );
        assert_eq!(Shard::all().file_name("nvidia-h200", "ron"), "nvidia-h200.ron");
        assert_eq!(Shard::of_file_name("nvidia-h200-w4a16.shard-3-of-8.jsonl"), Some(s));
        assert_eq!(Shard::of_file_name("nvidia-h200-w4a16.jsonl"), None);
        assert_eq!(
            Manifest::path_of_log(Path::new("/r/x.shard-3-of-8.jsonl.gz")),
            Path::new("/r/x.shard-3-of-8.manifest.json")
        );
    }

    #[test]
    fn manifests_round_trip_and_refuse_other_versions() {
        let d = tempfile::tempdir().unwrap();
        let key = TableKey::gemm(
            crate::template::Family::Sm90,
            crate::problem::AType::Bf16,
            512,
            6144,
            1,
        );
        let m = Manifest {
            schema_version: MANIFEST_SCHEMA_VERSION,
            shard: Shard { index: 1, count: 2 },
            device: "NVIDIA H200".into(),
            compute_capability: (9, 0),
            template_hash: "h".into(),
            campaign_keys: vec![key.clone()],
            keys: vec![key],
            finished: false,
            table: "nvidia-h200.shard-1-of-2.ron".into(),
        };
        let p = d.path().join("a/m.manifest.json");
        m.save(&p).unwrap();
        assert_eq!(Manifest::load(&p).unwrap(), Some(m));
        assert_eq!(Manifest::load(&d.path().join("none.json")).unwrap(), None);
        std::fs::write(&p, r#"{"schema_version": 9}"#).unwrap();
        assert!(matches!(Manifest::load(&p), Err(ManifestError::Version { found: 9, .. })));
    }
}
