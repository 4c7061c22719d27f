//! Merging the logs of a sharded campaign (Slurm arrays, Kubernetes indexed jobs, several hosts).

use super::log::{self, Record};
use std::collections::HashSet;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum MergeError {
    #[error(transparent)]
    Log(#[from] log::LogError),
    #[error("{path}: records from {found}, but {first_path} has {expected}: logs of different GPU models cannot be merged")]
    Device { path: PathBuf, found: String, first_path: PathBuf, expected: String },
    #[error("{path}: {family} records made with templates {found}, but {first_path} used {expected}: logs of different template versions cannot be merged")]
    Templates {
        path: PathBuf,
        family: String,
        found: String,
        first_path: PathBuf,
        expected: String,
    },
    #[error("no records in {0:?}")]
    Empty(Vec<PathBuf>),
    #[error("writing {path}: {source}")]
    Write { path: PathBuf, source: std::io::Error },
}

/// Read `paths`, refuse mixed GPU models or template versions, drop duplicate (key, method, config)
/// pairs (the first wins), and return the records in a stable order.
pub fn merge(paths: &[PathBuf]) -> Result<Vec<Record>, MergeError> {
    let mut out: Vec<Record> = Vec::new();
    let mut first: Option<(PathBuf, Record)> = None;
    let mut seen = HashSet::new();
    for path in paths {
        for r in log::read(path)? {
            match &first {
                None => first = Some((path.clone(), r.clone())),
                Some((fp, f)) => {
                    let id = |x: &Record| {
                        format!(
                            "{} (cc {}.{})",
                            x.device, x.compute_capability.0, x.compute_capability.1
                        )
                    };
                    if id(&r) != id(f) {
                        return Err(MergeError::Device {
                            path: path.clone(),
                            found: id(&r),
                            first_path: fp.clone(),
                            expected: id(f),
                        });
                    }
                }
            }
            if let Some(other) = out
                .iter()
                .find(|o| o.key.family == r.key.family && o.template_hash != r.template_hash)
            {
                return Err(MergeError::Templates {
                    path: path.clone(),
                    family: r.key.family.to_string(),
                    found: r.template_hash.chars().take(16).collect(),
                    first_path: paths[0].clone(),
                    expected: other.template_hash.chars().take(16).collect(),
                });
            }
            // A composite record names its key's fallback kernel, which has its own fused
            // record: the method is part of the identity.
            if seen.insert((r.key.clone(), r.method, r.config)) {
                out.push(r);
            }
        }
    }
    if out.is_empty() {
        return Err(MergeError::Empty(paths.to_vec()));
    }
    out.sort_by(|a, b| {
        a.key.cmp(&b.key).then(a.method.cmp(&b.method)).then(a.config.cmp(&b.config))
    });
    Ok(out)
}

/// Write records as a new log at `path` (atomically: temporary file, then rename), gzip-compressed
/// when `path` ends in `.gz`.
pub fn write(path: &Path, records: &[Record]) -> Result<(), MergeError> {
    let err = |source| MergeError::Write { path: path.to_path_buf(), source };
    let mut text = String::new();
    for r in records {
        text.push_str(&serde_json::to_string(r).expect("records serialize"));
        text.push('\n');
    }
    let bytes = if log::is_gzip(path) {
        use std::io::Write as _;
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        gz.write_all(text.as_bytes()).map_err(err)?;
        gz.finish().map_err(err)?
    } else {
        text.into_bytes()
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(err)?;
    }
    crate::compile::cache::write_atomic(path, &bytes).map_err(err)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tune::log::tests::record;
    use crate::tune::log::Writer;

    fn log_of(dir: &Path, name: &str, recs: &[Record]) -> PathBuf {
        let p = dir.join(name);
        let mut w = Writer::open(&p).unwrap();
        for r in recs {
            w.append(r).unwrap();
        }
        p
    }

    #[test]
    fn merges_shards_and_drops_duplicates() {
        let d = tempfile::tempdir().unwrap();
        let a = log_of(d.path(), "a.jsonl", &[record(1, Some(3.0)), record(2, Some(4.0))]);
        let b = log_of(d.path(), "b.jsonl", &[record(4, Some(5.0)), record(1, Some(9.0))]);
        let m = merge(&[a, b]).unwrap();
        assert_eq!(m.len(), 3);
        assert_eq!(m.iter().find(|r| r.key.m == 1).unwrap().outcome.median_us(), Some(3.0));
        let out = d.path().join("merged/all.jsonl");
        write(&out, &m).unwrap();
        assert_eq!(log::read(&out).unwrap(), m);
    }

    /// Compressed logs (`*.jsonl.gz`, as kept in results/) are read by merge (and so by
    /// `simulate`, which reads through `log::read` too) and written compressed when asked.
    #[test]
    fn gzip_logs_are_read_and_written() {
        let d = tempfile::tempdir().unwrap();
        let plain = log_of(d.path(), "a.jsonl", &[record(1, Some(3.0)), record(2, Some(4.0))]);
        let gz = d.path().join("b.jsonl.gz");
        write(&gz, &[record(4, Some(5.0))]).unwrap();
        let bytes = std::fs::read(&gz).unwrap();
        assert_eq!(&bytes[..2], &[0x1f, 0x8b], "gzip magic");
        assert_eq!(log::read(&gz).unwrap(), vec![record(4, Some(5.0))]);
        let m = merge(&[plain, gz]).unwrap();
        assert_eq!(m.len(), 3);
        let out = d.path().join("merged.jsonl.gz");
        write(&out, &m).unwrap();
        assert_eq!(log::read(&out).unwrap(), m);
    }

    /// A composite record names its key's fallback kernel, which has a fused record of its own:
    /// both survive the merge.
    #[test]
    fn composite_records_are_not_duplicates_of_their_fallback() {
        let d = tempfile::tempdir().unwrap();
        let fused = record(1, Some(3.0));
        let composite =
            Record { method: crate::table::Method::DequantCublasBf16, ..record(1, Some(2.0)) };
        let a = log_of(d.path(), "a.jsonl", &[fused, composite]);
        let merged = merge(&[a]).unwrap();
        assert_eq!(merged.len(), 2);
        assert_eq!(merged.iter().filter(|r| !r.method.is_fused()).count(), 1);
    }

    #[test]
    fn refuses_other_gpus_and_template_versions() {
        let d = tempfile::tempdir().unwrap();
        let a = log_of(d.path(), "a.jsonl", &[record(1, Some(3.0))]);
        let mut other = record(2, Some(3.0));
        other.device = "NVIDIA RTX PRO 6000 Blackwell Server Edition".into();
        let b = log_of(d.path(), "b.jsonl", &[other]);
        let e = merge(&[a.clone(), b]).unwrap_err().to_string();
        assert!(e.contains("different GPU models") && e.contains("b.jsonl"), "{e}");
        let mut newer = record(2, Some(3.0));
        newer.template_hash = "another".into();
        let c = log_of(d.path(), "c.jsonl", &[newer]);
        let e = merge(&[a, c]).unwrap_err().to_string();
        assert!(e.contains("different template versions"), "{e}");
        assert!(matches!(merge(&[d.path().join("missing.jsonl")]), Err(MergeError::Empty(_))));
    }
}
