//! The append-only measurement log of a tuning campaign (JSON lines, one record per evaluated
//! candidate), the basis of resume, shard merging and offline strategy simulation.
//!
//! A record is appended and flushed as soon as its candidate finishes, so a killed run (even
//! SIGKILL) loses at most the candidate in flight. A torn last line (the write cut short) is
//! ignored on reading; any other malformed line is an error naming the file and line.

use crate::bench::Summary;
use crate::table::Method;
use crate::template::GemmConfig;
use serde::{Deserialize, Serialize};
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};

/// Version of the record format this fp4tune writes. Version 2 added `Record::method`.
pub const LOG_SCHEMA_VERSION: u32 = 2;
/// Versions this fp4tune reads (version 1 records are all fused kernels).
pub const LOG_SCHEMA_VERSIONS_READ: &[u32] = &[1, 2];

/// What a tuning entry is about: one operation on one weight shape at one token bucket. The same
/// key as the dispatch table's, so a record's key is the entry's key (grouped ops set `experts`).
use crate::table::TableKey;

/// How a candidate's evaluation ended. Failures are data.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Outcome {
    /// Verified against the CPU reference, then timed (microseconds per launch).
    Timed {
        time: Summary,
        samples: Vec<f64>,
    },
    /// The configuration cannot run this problem (checked before compiling).
    Illegal {
        reason: String,
    },
    CompileError {
        log: String,
    },
    /// Over a device limit found at load or launch (shared memory, registers, threads).
    ResourceLimit {
        reason: String,
    },
    WrongAnswer {
        reason: String,
    },
    LaunchError {
        reason: String,
    },
    /// The worker did not answer within the time limit.
    Timeout {
        seconds: f64,
    },
}

impl Outcome {
    pub fn median_us(&self) -> Option<f64> {
        match self {
            Outcome::Timed { time, .. } => Some(time.median),
            _ => None,
        }
    }

    /// Short label for tables ("ok", "compile_error", ...).
    pub fn label(&self) -> &'static str {
        match self {
            Outcome::Timed { .. } => "ok",
            Outcome::Illegal { .. } => "illegal",
            Outcome::CompileError { .. } => "compile_error",
            Outcome::ResourceLimit { .. } => "resource_limit",
            Outcome::WrongAnswer { .. } => "wrong_answer",
            Outcome::LaunchError { .. } => "launch_error",
            Outcome::Timeout { .. } => "timeout",
        }
    }
}

/// How and where a campaign measured: stored with its records so that merged logs can produce a
/// complete dispatch table without the GPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Context {
    pub sm_count: u32,
    pub driver_version: (i32, i32),
    pub nvrtc_version: (i32, i32),
    /// Read bandwidth and bf16 tensor peak measured at the start of the campaign.
    pub bandwidth_gbps: f64,
    pub tensor_peak_tflops: f64,
    /// Empty-kernel launch floor under the same policy (absent in the first logs).
    #[serde(default)]
    pub launch_floor_us: f64,
    pub timing_policy: String,
}

/// One evaluated candidate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    pub schema_version: u32,
    pub key: TableKey,
    /// `Fused`: `config` was measured. `DequantCublasBf16`: the composite path was measured, and
    /// `config` is the key's best fused kernel at that time (the table entry's fallback).
    #[serde(default, skip_serializing_if = "Method::is_fused")]
    pub method: Method,
    pub config: GemmConfig,
    pub outcome: Outcome,
    /// Device name and compute capability the record was measured on.
    pub device: String,
    pub compute_capability: (u32, u32),
    /// `template::family_template_hash` of the family at measurement time.
    pub template_hash: String,
    /// Unix seconds.
    pub at: u64,
    /// Measurement context (absent in records written before it existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<Context>,
}

#[derive(Debug, thiserror::Error)]
pub enum LogError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path}:{line}: not a measurement record: {message}")]
    Parse { path: PathBuf, line: usize, message: String },
    #[error(
        "{path}:{line}: record schema version {found}, this fp4tune reads versions 1 and {LOG_SCHEMA_VERSION}"
    )]
    Version { path: PathBuf, line: usize, found: u32 },
}

/// Whether `path` names a gzip-compressed log (`*.gz`, e.g. `results/h200/<log>.jsonl.gz`).
pub fn is_gzip(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == "gz")
}

/// Read every record of a log, plain or gzip-compressed (`*.jsonl.gz`). A missing file is an
/// empty log.
pub fn read(path: &Path) -> Result<Vec<Record>, LogError> {
    let io = |source| LogError::Io { path: path.to_path_buf(), source };
    let file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io(e)),
    };
    let reader: Box<dyn std::io::Read> = if is_gzip(path) {
        Box::new(flate2::read::MultiGzDecoder::new(file))
    } else {
        Box::new(file)
    };
    let lines: Vec<String> =
        std::io::BufReader::new(reader).lines().collect::<Result<_, _>>().map_err(io)?;
    let last = lines.len();
    let mut out = Vec::with_capacity(lines.len());
    for (i, line) in lines.iter().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        #[derive(Deserialize)]
        struct Version {
            schema_version: u32,
        }
        match serde_json::from_str::<Version>(line) {
            Ok(v) if !LOG_SCHEMA_VERSIONS_READ.contains(&v.schema_version) => {
                return Err(LogError::Version {
                    path: path.to_path_buf(),
                    line: i + 1,
                    found: v.schema_version,
                })
            }
            _ => {}
        }
        match serde_json::from_str::<Record>(line) {
            Ok(r) => out.push(r),
            // A torn final line is what a killed writer leaves: skip it (it is re-measured).
            Err(_) if i + 1 == last && !line.ends_with('}') => {}
            Err(e) => {
                return Err(LogError::Parse {
                    path: path.to_path_buf(),
                    line: i + 1,
                    message: e.to_string(),
                })
            }
        }
    }
    Ok(out)
}

/// Appends records, one flushed and fsynced line each.
#[derive(Debug)]
pub struct Writer {
    path: PathBuf,
    file: std::fs::File,
}

impl Writer {
    /// Open for appending (creating the file and its folder). A torn last line (left by a
    /// killed writer) is cut off first, so the next record starts cleanly.
    pub fn open(path: &Path) -> Result<Self, LogError> {
        let io = |source| LogError::Io { path: path.to_path_buf(), source };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
        let keep = match std::fs::read(path) {
            Ok(b) if !b.is_empty() && !b.ends_with(b"\n") => {
                Some(b.iter().rposition(|&c| c == b'\n').map_or(0, |i| i + 1) as u64)
            }
            _ => None,
        };
        let file = std::fs::OpenOptions::new().create(true).append(true).open(path).map_err(io)?;
        if let Some(len) = keep {
            file.set_len(len).map_err(io)?;
        }
        Ok(Self { path: path.to_path_buf(), file })
    }

    pub fn append(&mut self, r: &Record) -> Result<(), LogError> {
        let io = |source| LogError::Io { path: self.path.clone(), source };
        let mut line = serde_json::to_string(r).map_err(|e| io(std::io::Error::other(e)))?;
        line.push('\n');
        self.file.write_all(line.as_bytes()).map_err(io)?;
        self.file.sync_data().map_err(io)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::problem::AType;
    use crate::template::Family;

    pub(crate) fn record(m: u32, median: Option<f64>) -> Record {
        let config = crate::template::search_space(Family::Sm90, AType::Bf16)[0];
        Record {
            schema_version: LOG_SCHEMA_VERSION,
            method: Method::Fused,
            key: TableKey {
                experts: None,
                op: "gemm".into(),
                family: Family::Sm90,
                a_type: AType::Bf16,
                n: 512,
                k: 6144,
                m,
            },
            config,
            outcome: match median {
                Some(t) => Outcome::Timed {
                    time: Summary { n: 1, median: t, lo: t, hi: t, min: t, max: t },
                    samples: vec![t],
                },
                None => Outcome::WrongAnswer { reason: "bad".into() },
            },
            device: "NVIDIA H200".into(),
            compute_capability: (9, 0),
            template_hash: "h".into(),
            at: 0,
            context: None,
        }
    }

    #[test]
    fn append_read_and_torn_tail() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/log.jsonl");
        assert!(read(&path).unwrap().is_empty());
        let mut w = Writer::open(&path).unwrap();
        w.append(&record(1, Some(3.0))).unwrap();
        w.append(&record(2, None)).unwrap();
        drop(w);
        assert_eq!(read(&path).unwrap(), vec![record(1, Some(3.0)), record(2, None)]);
        // A killed writer leaves half a line: it is skipped, and the next writer starts cleanly.
        let mut bytes = std::fs::read(&path).unwrap();
        bytes.extend_from_slice(b"{\"schema_version\":1,\"key\":{\"op\":\"ge");
        std::fs::write(&path, &bytes).unwrap();
        assert_eq!(read(&path).unwrap().len(), 2);
        let mut w = Writer::open(&path).unwrap();
        w.append(&record(4, Some(1.0))).unwrap();
        let all = read(&path).unwrap();
        assert_eq!(all.len(), 3);
        assert_eq!(all[2].key.m, 4);
    }

    #[test]
    fn bad_lines_and_versions_are_errors_naming_the_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log.jsonl");
        let good = serde_json::to_string(&record(1, Some(3.0))).unwrap();
        std::fs::write(&path, format!("{good}\n{{\"nonsense\": 1}}\n{good}\n")).unwrap();
        let e = read(&path).unwrap_err().to_string();
        assert!(e.contains("log.jsonl:2"), "{e}");
        // Version 1 records (no `method`) still read, as fused kernels.
        let v1 = good.replace("\"schema_version\":2", "\"schema_version\":1");
        std::fs::write(&path, format!("{v1}\n")).unwrap();
        assert_eq!(read(&path).unwrap()[0].method, Method::Fused);
        let v9 = good.replace("\"schema_version\":2", "\"schema_version\":9");
        std::fs::write(&path, format!("{v9}\n")).unwrap();
        let e = read(&path).unwrap_err().to_string();
        assert!(e.contains("schema version 9"), "{e}");
    }
}
