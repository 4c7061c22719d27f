//! The append-only measurement log of a tuning campaign (JSON lines, one record per evaluated
//! candidate), the basis of resume, shard merging and offline strategy simulation.
//!
//! A record is appended and flushed as soon as its candidate finishes, so a killed run (even
//! SIGKILL) loses at most the candidate in flight. A last line without its newline (the write cut
//! short, wherever) is torn: ignored on reading and reported to the caller
//! ([`LogContents::torn_tail`]); any other malformed or implausible line is an error naming the
//! file and line. One writer at a time: [`Writer`] holds `<log>.lock`.

use crate::bench::Summary;
use crate::table::Method;
use crate::template::GemmConfig;
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::{Path, PathBuf};

/// Version of the record format this fp4tune writes. Version 2 added `Record::method`. Records
/// refuse unknown fields, so a field added to `Record` or `Context` needs a new version (an older
/// fp4tune then says "schema version", not "unknown field").
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
    /// Verified against the CPU reference, then timed under a racing campaign's short screening
    /// policy: ranks candidates, never a table entry's time.
    Screened {
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
    /// The full-policy median (what a table entry may record).
    pub fn median_us(&self) -> Option<f64> {
        match self {
            Outcome::Timed { time, .. } => Some(time.median),
            _ => None,
        }
    }

    /// The median a racing campaign ranks by: a screening or a full-policy timing.
    pub fn screen_us(&self) -> Option<f64> {
        match self {
            Outcome::Timed { time, .. } | Outcome::Screened { time, .. } => Some(time.median),
            _ => None,
        }
    }

    /// A timing taken under the screening policy is recorded as such.
    pub fn screened(self) -> Self {
        match self {
            Outcome::Timed { time, samples } => Outcome::Screened { time, samples },
            other => other,
        }
    }

    /// Short label for tables ("ok", "compile_error", ...).
    pub fn label(&self) -> &'static str {
        match self {
            Outcome::Timed { .. } => "ok",
            Outcome::Screened { .. } => "screened",
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
#[serde(deny_unknown_fields)]
pub struct Context {
    pub sm_count: u32,
    pub driver_version: (i32, i32),
    pub nvrtc_version: (i32, i32),
    /// The NVRTC build that compiled the campaign's kernels (`Compiler::nvrtc_build`; absent in
    /// older logs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvrtc_build: Option<String>,
    /// Read bandwidth and the data path's tensor peak (`bench::run::data_path_peak_tflops`: bf16
    /// on sm90, FP4 on sm120) measured at the start of the campaign.
    pub bandwidth_gbps: f64,
    pub tensor_peak_tflops: f64,
    /// Empty-kernel launch floor under the same policy (absent in the first logs).
    #[serde(default)]
    pub launch_floor_us: f64,
    pub timing_policy: String,
}

/// One evaluated candidate. A misspelled field is an error, not a record read without it (a
/// `methd` would read a composite record as a fused one).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
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
    // The OS error is part of the message and deliberately not a `source`: printed with its
    // chain (`{:#}`), a source would repeat it.
    #[error("{path}: {error}")]
    Io { path: PathBuf, error: std::io::Error },
    #[error("{path}:{line}: not a measurement record: {message}")]
    Parse { path: PathBuf, line: usize, message: String },
    #[error(
        "{path}:{line}: record schema version {found}, this fp4tune reads versions 1 and {LOG_SCHEMA_VERSION}"
    )]
    Version { path: PathBuf, line: usize, found: u32 },
    /// A record that parses but cannot be a real measurement (or names an impossible
    /// configuration).
    #[error("{path}:{line}: implausible measurement record: {reason}; remove the line (or re-measure the candidate)")]
    Implausible { path: PathBuf, line: usize, reason: String },
    #[error(
        "{path}: another fp4tune ({holder}) is writing this log (lock file {lock}); two runs \
         sharing one --out would mix their records: wait for it or use another --out (remove the \
         lock file only if that process is gone)"
    )]
    Locked { path: PathBuf, lock: PathBuf, holder: String },
}

/// Whether `path` names a gzip-compressed log (`*.gz`, e.g. `results/h200/<log>.jsonl.gz`).
pub fn is_gzip(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == "gz")
}

/// A last line without its newline: what a writer killed in the middle of a record leaves,
/// wherever it was cut. It is not read (the candidate is measured again); callers may warn.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TornTail {
    pub path: PathBuf,
    /// 1-based line number of the torn line.
    pub line: usize,
    /// Its length in bytes.
    pub bytes: usize,
}

impl std::fmt::Display for TornTail {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}:{}: the last record has no newline ({} bytes, cut short by a killed run): ignored \
             (a resumed tune measures its candidate again)",
            self.path.display(),
            self.line,
            self.bytes
        )
    }
}

/// A log as read: its records, the line each came from, and a torn last line if there was one.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct LogContents {
    pub records: Vec<Record>,
    /// 1-based line number of each record in `records`.
    pub lines: Vec<usize>,
    pub torn_tail: Option<TornTail>,
}

/// Read every record of a log, plain or gzip-compressed (`*.jsonl.gz`); a missing file is an
/// error naming it. See [`read_log`] (this drops the torn-tail warning).
pub fn read(path: &Path) -> Result<Vec<Record>, LogError> {
    Ok(read_log(path)?.records)
}

/// Read a log with the line of every record and the torn last line, if any (see
/// [`parse_log`]); a missing file is an error naming it (a misspelled `--log` or shard must not
/// read as an empty log).
pub fn read_log(path: &Path) -> Result<LogContents, LogError> {
    read_log_opt(path)?.ok_or_else(|| LogError::Io {
        path: path.to_path_buf(),
        error: std::io::Error::new(std::io::ErrorKind::NotFound, "no such file"),
    })
}

/// The log a campaign resumes from: as [`read_log`], but a log not written yet is an empty one.
pub fn read_log_or_empty(path: &Path) -> Result<LogContents, LogError> {
    Ok(read_log_opt(path)?.unwrap_or_default())
}

/// [`read_log`], with `None` for a missing file.
fn read_log_opt(path: &Path) -> Result<Option<LogContents>, LogError> {
    use std::io::Read as _;
    let io = |error| LogError::Io { path: path.to_path_buf(), error };
    let file = match crate::fsio::open_input(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io(e)),
    };
    let mut reader: Box<dyn std::io::Read> = if is_gzip(path) {
        Box::new(flate2::read::MultiGzDecoder::new(file))
    } else {
        Box::new(file)
    };
    let mut bytes = Vec::new();
    reader.read_to_end(&mut bytes).map_err(io)?;
    parse_log(&bytes, path).map(Some)
}

/// Parse the bytes of a log; `path` names it in errors. A last line without its newline is
/// torn by definition (a writer killed mid-record) and reported in
/// [`LogContents::torn_tail`], not parsed; a leading UTF-8 byte-order mark is skipped; blank
/// lines are skipped. Any other line that is not a record of a known version, or a record that
/// cannot be a real measurement ([`check_record`]), is an error naming the file and line.
pub fn parse_log(bytes: &[u8], path: &Path) -> Result<LogContents, LogError> {
    let bytes = bytes.strip_prefix("\u{feff}".as_bytes()).unwrap_or(bytes);
    let mut out = LogContents::default();
    let mut lines: Vec<&[u8]> = bytes.split(|&b| b == b'\n').collect();
    // After the last newline: empty for a complete log, else the torn tail.
    let tail = lines.pop().unwrap_or_default();
    if !tail.iter().all(u8::is_ascii_whitespace) {
        out.torn_tail =
            Some(TornTail { path: path.to_path_buf(), line: lines.len() + 1, bytes: tail.len() });
    }
    for (i, line) in lines.iter().enumerate() {
        let at = i + 1;
        let parse =
            |message: String| LogError::Parse { path: path.to_path_buf(), line: at, message };
        let line = std::str::from_utf8(line).map_err(|e| parse(format!("not UTF-8 text ({e})")))?;
        if line.trim().is_empty() {
            continue;
        }
        #[derive(Deserialize)]
        struct Version {
            schema_version: u32,
        }
        match serde_json::from_str::<Version>(line) {
            Ok(v) if !LOG_SCHEMA_VERSIONS_READ.contains(&v.schema_version) => {
                if is_grouped_line(line) {
                    return Err(parse(GROUPED_LINE.to_string()));
                }
                return Err(LogError::Version {
                    path: path.to_path_buf(),
                    line: at,
                    found: v.schema_version,
                });
            }
            _ => {}
        }
        let r = serde_json::from_str::<Record>(line).map_err(|e| {
            parse(if is_grouped_line(line) {
                GROUPED_LINE.to_string()
            } else if e.to_string().starts_with("unknown field") {
                format!("{e} (a misspelled field, or a log of a newer fp4tune)")
            } else {
                e.to_string()
            })
        })?;
        check_record(&r).map_err(|reason| LogError::Implausible {
            path: path.to_path_buf(),
            line: at,
            reason,
        })?;
        out.records.push(r);
        out.lines.push(at);
    }
    Ok(out)
}

/// What a GEMM log reader says of a line of a grouped tune's log.
const GROUPED_LINE: &str = "a line of a grouped MoE tune's log (`<sku>-moe.jsonl`), not of a GEMM \
                            measurement log (`<sku>.jsonl`): give the GEMM log";

/// Whether `line` is a record of a grouped tune's log (`tune::moe::MoeLogRecord`: a key with
/// `top_k` and one candidate), which GEMM log readers do not take.
fn is_grouped_line(line: &str) -> bool {
    serde_json::from_str::<serde_json::Value>(line).is_ok_and(|v| {
        v.get("key").is_some_and(|k| k.get("top_k").is_some()) && v.get("candidate").is_some()
    })
}

/// Whether a record can be a real measurement: its configuration within
/// [`crate::template::BOUNDS`], and a timed record's times plausible
/// ([`crate::table::implausible_time`]). Returns why not.
pub fn check_record(r: &Record) -> Result<(), String> {
    let k = &r.key;
    if k.n == 0 || k.k == 0 || k.m == 0 || k.k % 16 != 0 {
        return Err(format!(
            "key N = {}, K = {}, M = {}: N, K and M must be positive and K a multiple of 16",
            k.n, k.k, k.m
        ));
    }
    r.config.check_bounds().map_err(|e| e.to_string())?;
    if let Outcome::Timed { time, .. } | Outcome::Screened { time, .. } = &r.outcome {
        if let Some(why) = crate::table::implausible_time(time.median, time.lo, time.hi) {
            return Err(why);
        }
    }
    Ok(())
}

/// Appends records, one line written at once each (synced to the disk at most every
/// [`SYNC_INTERVAL`]). Holds `<log>.lock` while open, so two runs cannot write one log at once.
#[derive(Debug)]
pub struct Writer {
    path: PathBuf,
    file: std::fs::File,
    _lock: LockFile,
    /// When the file was last synced to the disk.
    synced: std::time::Instant,
}

/// `<log>.lock`, holding the writer's process id; removed when the writer is dropped.
#[derive(Debug)]
struct LockFile {
    path: PathBuf,
}

impl Drop for LockFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The lock file of the log at `path`.
pub fn lock_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".lock");
    path.with_file_name(name)
}

/// Whether process `pid` exists (Linux: `/proc/<pid>`; elsewhere assumed to).
fn process_exists(pid: u32) -> bool {
    if !Path::new("/proc/self").exists() {
        return true;
    }
    Path::new("/proc").join(pid.to_string()).exists()
}

impl LockFile {
    /// Take the lock of the log at `log`: created exclusively with this process's id; a lock
    /// whose process is gone (a killed run) is taken over; a live one is a
    /// [`LogError::Locked`] naming its process.
    fn acquire(log: &Path) -> Result<LockFile, LogError> {
        let path = lock_path(log);
        let io = |error| LogError::Io { path: path.clone(), error };
        for _ in 0..2 {
            match std::fs::OpenOptions::new().write(true).create_new(true).open(&path) {
                Ok(mut f) => {
                    f.write_all(format!("{}\n", std::process::id()).as_bytes()).map_err(io)?;
                    f.sync_all().map_err(io)?;
                    return Ok(LockFile { path });
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    let text = std::fs::read_to_string(&path).unwrap_or_default();
                    let holder = match text.trim().parse::<u32>() {
                        Ok(pid) if process_exists(pid) => format!("pid {pid}"),
                        Ok(_) => {
                            // Its process is gone: a killed run's lock.
                            let _ = std::fs::remove_file(&path);
                            continue;
                        }
                        Err(_) => {
                            // Being written this instant, or garbage: stale once it is old.
                            let age = std::fs::metadata(&path)
                                .and_then(|m| m.modified())
                                .ok()
                                .and_then(|t| t.elapsed().ok());
                            if age.is_some_and(|a| a > std::time::Duration::from_secs(60)) {
                                let _ = std::fs::remove_file(&path);
                                continue;
                            }
                            "a process that is starting".to_string()
                        }
                    };
                    return Err(LogError::Locked { path: log.to_path_buf(), lock: path, holder });
                }
                Err(e) => return Err(io(e)),
            }
        }
        Err(LogError::Locked {
            path: log.to_path_buf(),
            lock: path,
            holder: "another process (it took the lock at the same time)".into(),
        })
    }
}

impl Writer {
    /// Open for appending (creating the file and its folder), taking the log's lock file first.
    /// A torn last line (left by a killed writer) is cut off, so the next record starts cleanly.
    pub fn open(path: &Path) -> Result<Self, LogError> {
        let io = |error| LogError::Io { path: path.to_path_buf(), error };
        crate::fsio::create_parent_dir(path).map_err(io)?;
        let lock = LockFile::acquire(path)?;
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
        Ok(Self { path: path.to_path_buf(), file, _lock: lock, synced: std::time::Instant::now() })
    }

    /// Append one record in one write (a killed process loses nothing written). The file is
    /// synced to the disk at most every [`SYNC_INTERVAL`] and when the writer is dropped, so a
    /// machine that goes down loses at most that much of the campaign.
    pub fn append(&mut self, r: &Record) -> Result<(), LogError> {
        let io = |error| LogError::Io { path: self.path.clone(), error };
        let mut line = serde_json::to_string(r).map_err(|e| io(std::io::Error::other(e)))?;
        line.push('\n');
        self.file.write_all(line.as_bytes()).map_err(io)?;
        if self.synced.elapsed() >= SYNC_INTERVAL {
            self.file.sync_data().map_err(io)?;
            self.synced = std::time::Instant::now();
        }
        Ok(())
    }
}

/// Longest time appended records stay unsynced (see [`Writer::append`]).
pub const SYNC_INTERVAL: std::time::Duration = std::time::Duration::from_millis(500);

impl Drop for Writer {
    fn drop(&mut self) {
        let _ = self.file.sync_data();
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
        // a log not written yet: empty for a campaign that resumes, an error naming it otherwise
        assert!(read_log_or_empty(&path).unwrap().records.is_empty());
        let e = read(&path).unwrap_err().to_string();
        assert!(e.contains("sub/log.jsonl") && e.contains("no such file"), "{e}");
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
        // A misspelled field is an error naming the line and the field, not dropped: a
        // composite record whose `method` is misspelled does not read as a fused one.
        let composite = Record { method: Method::DequantCublasBf16, ..record(1, Some(3.0)) };
        let composite = serde_json::to_string(&composite).unwrap();
        let typo = composite.replace("\"method\":", "\"methd\":");
        assert_ne!(typo, composite);
        std::fs::write(&path, format!("{good}\n{typo}\n")).unwrap();
        let e = read(&path).unwrap_err().to_string();
        assert!(
            e.contains("log.jsonl:2") && e.contains("methd") && e.contains("misspelled"),
            "{e}"
        );
        let v9 = good.replace("\"schema_version\":2", "\"schema_version\":9");
        std::fs::write(&path, format!("{v9}\n")).unwrap();
        let e = read(&path).unwrap_err().to_string();
        assert!(e.contains("schema version 9"), "{e}");
    }
}

#[cfg(test)]
mod reliability_tests {
    use super::tests::record;
    use super::*;

    fn line(r: &Record) -> String {
        serde_json::to_string(r).unwrap() + "\n"
    }

    /// A last line without its newline is torn wherever the write was cut, even right after an
    /// inner `}` or after the whole record: it is skipped and reported, never an error, and the
    /// next writer cuts it off.
    #[test]
    fn a_last_line_without_newline_is_torn_wherever_it_was_cut() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log.jsonl");
        let head = line(&record(1, Some(3.0))) + &line(&record(2, None));
        let last = line(&record(4, Some(5.0)));
        let last = last.trim_end();
        let inner = last.find('}').unwrap() + 1;
        for cut in [1, inner, last.len() / 2, last.len() - 1, last.len()] {
            std::fs::write(&path, format!("{head}{}", &last[..cut])).unwrap();
            let c = read_log(&path).unwrap_or_else(|e| panic!("cut at {cut}: {e}"));
            assert_eq!(c.records, vec![record(1, Some(3.0)), record(2, None)], "cut at {cut}");
            assert_eq!(c.lines, vec![1, 2]);
            let torn = c.torn_tail.expect("the torn line is reported");
            assert_eq!((torn.line, torn.bytes), (3, cut));
            assert!(torn.to_string().contains("log.jsonl:3: the last record has no newline"));
        }
        let mut w = Writer::open(&path).unwrap();
        w.append(&record(8, Some(2.0))).unwrap();
        drop(w);
        let c = read_log(&path).unwrap();
        assert_eq!(c.records.len(), 3);
        assert_eq!(c.torn_tail, None);
        // A byte-order mark (an editor's) is skipped.
        std::fs::write(&path, format!("\u{feff}{head}")).unwrap();
        assert_eq!(read(&path).unwrap().len(), 2);
    }

    /// A median outside its own interval, below the launch floor, or a configuration outside the
    /// bounds is refused, naming the log file and line.
    #[test]
    fn implausible_records_are_refused_by_file_and_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log.jsonl");
        let good = line(&record(1, Some(3.0)));
        let with = |edit: fn(&mut Record)| {
            let mut r = record(2, Some(3.0));
            edit(&mut r);
            std::fs::write(&path, format!("{good}{}", line(&r))).unwrap();
            read(&path).unwrap_err().to_string()
        };
        let e = with(|r| {
            if let Outcome::Timed { time, .. } = &mut r.outcome {
                (time.median, time.lo, time.hi) = (1e-9, 2.0, 3.0);
            }
        });
        assert!(e.contains("log.jsonl:2: implausible measurement record"), "{e}");
        assert!(e.contains("outside its own interval"), "{e}");
        let e = with(|r| {
            if let Outcome::Timed { time, .. } = &mut r.outcome {
                (time.median, time.lo, time.hi) = (0.1, 0.05, 0.2);
            }
        });
        assert!(e.contains("log.jsonl:2:") && e.contains("below the 0.5 us launch floor"), "{e}");
        let e = with(|r| r.config.warps_m = 67_108_866);
        assert!(
            e.contains("log.jsonl:2:") && e.contains("warps_m 67108866 is out of range"),
            "{e}"
        );
    }

    #[test]
    fn one_writer_per_log() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out/log.jsonl");
        let lock = lock_path(&path);
        assert_eq!(lock.file_name().unwrap(), "log.jsonl.lock");
        let w = Writer::open(&path).unwrap();
        assert_eq!(std::fs::read_to_string(&lock).unwrap().trim(), std::process::id().to_string());
        let e = Writer::open(&path).unwrap_err().to_string();
        assert!(e.contains(&format!("pid {}", std::process::id())), "{e}");
        assert!(e.contains("log.jsonl.lock") && e.contains("another --out"), "{e}");
        drop(w);
        assert!(!lock.exists(), "the lock goes with its writer");
        // A killed run's lock (its process is gone) is taken over.
        std::fs::write(&lock, "4000000000\n").unwrap();
        drop(Writer::open(&path).unwrap());
        // A lock being written this instant (no pid yet) is respected; an old one is not.
        std::fs::write(&lock, "").unwrap();
        assert!(Writer::open(&path).is_err());
        let old = std::time::SystemTime::now() - std::time::Duration::from_secs(600);
        std::fs::File::options().write(true).open(&lock).unwrap().set_modified(old).unwrap();
        drop(Writer::open(&path).unwrap());
        assert!(!lock.exists());
    }

    /// An OS error is in the message once, not repeated by an error source (`{:#}` prints both).
    #[test]
    fn os_errors_are_printed_once() {
        let dir = tempfile::tempdir().unwrap();
        let plain = dir.path().join("plain.txt");
        std::fs::write(&plain, "x").unwrap();
        // a path under a regular file: ENOTDIR
        let e = read(&plain.join("log.jsonl")).unwrap_err();
        assert!(std::error::Error::source(&e).is_none());
        let text = format!("{:#}", anyhow::Error::from(e));
        assert_eq!(text.matches("os error").count(), 1, "{text}");
        let e = read(dir.path()).unwrap_err().to_string();
        assert!(e.contains("is a folder, not a file to read"), "{e}");
        // `--out` under a regular file names the file in the way, not "File exists".
        let file = dir.path().join("plain");
        std::fs::write(&file, "x").unwrap();
        let e = Writer::open(&file.join("log.jsonl")).unwrap_err().to_string();
        assert!(e.contains("plain exists and is not a folder"), "{e}");
    }
}
