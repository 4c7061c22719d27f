//! Merging the logs of a sharded campaign (Slurm arrays, Kubernetes indexed jobs, several hosts).

use super::log::{self, Record};
use std::collections::HashSet;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum MergeError {
    #[error(transparent)]
    Log(#[from] log::LogError),
    #[error(
        "{}:{line}: a record from {found}, but {}:{first_line} is from {expected}: logs of \
         different GPU models cannot be merged; merge each GPU model's logs on their own",
        path.display(), first_path.display()
    )]
    Device {
        path: PathBuf,
        line: usize,
        found: String,
        first_path: PathBuf,
        first_line: usize,
        expected: String,
    },
    #[error(transparent)]
    Templates(Box<TemplateConflict>),
    #[error("no records in {0:?}")]
    Empty(Vec<PathBuf>),
    // The OS error is in the message, deliberately not a `source` (a chain would repeat it).
    #[error("writing {}: {error}", path.display())]
    Write { path: PathBuf, error: std::io::Error },
}

/// Two template versions of one family among the logs being merged.
#[derive(Debug, thiserror::Error)]
#[error(
    "{}:{line}: a {family} record made with templates {}, but {}:{first_line} used {}: logs of \
     different template versions cannot be merged. {advice}",
    path.display(), short(found), first_path.display(), short(expected)
)]
pub struct TemplateConflict {
    pub path: PathBuf,
    pub line: usize,
    pub family: String,
    pub found: String,
    pub first_path: PathBuf,
    pub first_line: usize,
    pub expected: String,
    /// How to proceed: which version to keep, and how.
    pub advice: String,
}

fn short(hash: &str) -> &str {
    crate::template::short_hash(hash, 16)
}

/// Merged records and what the caller should warn about (torn last lines of killed runs).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Merged {
    pub records: Vec<Record>,
    pub warnings: Vec<String>,
}

/// What to do about a log mixing template versions `a` and `b` of `family`, at `path`.
fn template_advice(family: crate::template::Family, path: &Path, a: &str, b: &str) -> String {
    let current = crate::template::family_template_hash(family);
    let keep = if b == current { b } else { a };
    let drop = if keep == a { b } else { a };
    let now = if keep == current {
        format!("{} is this build's {family} version", short(keep))
    } else {
        format!("neither is this build's {family} version ({})", short(&current))
    };
    let cat = if log::is_gzip(path) { "zcat" } else { "cat" };
    format!(
        "{now}. Keep one version's records, e.g. `{cat} {} | grep -v '\"template_hash\":\"{drop}\"' \
         > filtered.jsonl` (and the same for the other logs), or re-tune with this build's \
         templates (`fp4tune tune`)",
        path.display()
    )
}

/// Read `paths`, refuse mixed GPU models or template versions, drop duplicate (key, method, config)
/// pairs (the first wins), and return the records in a stable order.
pub fn merge(paths: &[PathBuf]) -> Result<Vec<Record>, MergeError> {
    Ok(merge_logs(paths)?.records)
}

/// [`merge`], with the warnings a caller should print (a torn last line of a killed run, which
/// is left out). Linear in the number of records; every refusal names the file and line at fault
/// and the file and line it disagrees with.
pub fn merge_logs(paths: &[PathBuf]) -> Result<Merged, MergeError> {
    use std::collections::HashMap;
    let mut out: Vec<Record> = Vec::new();
    let mut warnings = Vec::new();
    // The first record's device, and the first template hash of each family, with their origin.
    let mut first: Option<(String, PathBuf, usize)> = None;
    let mut hashes: HashMap<crate::template::Family, (String, PathBuf, usize)> = HashMap::new();
    let mut seen = HashSet::new();
    let id = |x: &Record| {
        format!("{} (cc {}.{})", x.device, x.compute_capability.0, x.compute_capability.1)
    };
    for path in paths {
        let contents = log::read_log(path)?;
        if let Some(t) = &contents.torn_tail {
            warnings.push(t.to_string());
        }
        for (r, line) in contents.records.into_iter().zip(contents.lines) {
            match &first {
                None => first = Some((id(&r), path.clone(), line)),
                Some((expected, fp, fl)) if *expected != id(&r) => {
                    return Err(MergeError::Device {
                        path: path.clone(),
                        line,
                        found: id(&r),
                        first_path: fp.clone(),
                        first_line: *fl,
                        expected: expected.clone(),
                    });
                }
                Some(_) => {}
            }
            match hashes.get(&r.key.family) {
                None => {
                    hashes.insert(r.key.family, (r.template_hash.clone(), path.clone(), line));
                }
                Some((expected, fp, fl)) if *expected != r.template_hash => {
                    return Err(MergeError::Templates(Box::new(TemplateConflict {
                        path: path.clone(),
                        line,
                        family: r.key.family.to_string(),
                        found: r.template_hash.clone(),
                        first_path: fp.clone(),
                        first_line: *fl,
                        expected: expected.clone(),
                        advice: template_advice(r.key.family, path, expected, &r.template_hash),
                    })));
                }
                Some(_) => {}
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
    Ok(Merged { records: out, warnings })
}

/// The shards among the logs being merged (logs named `*.shard-i-of-n.jsonl` with their
/// manifest next to them), checked to be of one campaign.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ShardReport {
    /// The shard count of the campaign (0: no shard logs among the inputs).
    pub count: u32,
    /// The shards present, with their manifests.
    pub present: Vec<super::shard::Manifest>,
    /// Shard indices with no log among the inputs.
    pub missing: Vec<u32>,
    /// Shards whose campaign did not run to its end (killed, or still running).
    pub unfinished: Vec<u32>,
    /// Shards whose log has no manifest next to it: whether they finished cannot be told.
    pub without_manifest: Vec<u32>,
}

/// Why shards cannot be merged (one line each, naming both files).
#[derive(Debug, thiserror::Error)]
pub enum ShardMergeError {
    #[error(transparent)]
    Manifest(#[from] super::shard::ManifestError),
    #[error("{} and {}: shards of different campaigns ({what} differs: {a} vs {b}); merge each campaign's shards on their own", first.display(), other.display())]
    Mismatch { first: PathBuf, other: PathBuf, what: &'static str, a: String, b: String },
    #[error("{}: its name says shard {index} of {count}: {why}", path.display())]
    BadShard { path: PathBuf, index: u32, count: u32, why: String },
}

/// Read the manifests of the shard logs among `paths` and check they belong to one campaign:
/// the same shard count, GPU model, template version and campaign keys (shape set and buckets).
/// A shard log without its manifest still counts by its name (`shard-i-of-n`): its shard is
/// present (in `without_manifest`) and the others of its count are missing unless given. Logs
/// that are not a shard's are left alone.
pub fn check_shards(paths: &[PathBuf]) -> Result<ShardReport, ShardMergeError> {
    use super::shard::Manifest;
    let mut report = ShardReport::default();
    let mut first: Option<(PathBuf, Manifest)> = None;
    // (log, shard) of the first shard log, by name, for a campaign without manifests
    let mut named: Option<(PathBuf, super::shard::Shard)> = None;
    for p in paths {
        let name = p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let Some(shard) = super::shard::Shard::of_file_name(&name) else {
            continue;
        };
        if shard.count > super::shard::MAX_SHARDS {
            return Err(ShardMergeError::BadShard {
                path: p.clone(),
                index: shard.index,
                count: shard.count,
                why: format!("a campaign has at most {} shards", super::shard::MAX_SHARDS),
            });
        }
        match &named {
            Some((fp, f)) if f.count != shard.count => {
                return Err(ShardMergeError::Mismatch {
                    first: fp.clone(),
                    other: p.clone(),
                    what: "shard count",
                    a: f.count.to_string(),
                    b: shard.count.to_string(),
                })
            }
            Some(_) => {}
            None => named = Some((p.clone(), shard)),
        }
        let mp = Manifest::path_of_log(p);
        let Some(m) = Manifest::load(&mp)? else {
            if !report.without_manifest.contains(&shard.index) {
                report.without_manifest.push(shard.index);
            }
            continue;
        };
        let plain_name = std::path::Path::new(&m.table)
            .file_name()
            .is_some_and(|n| n.to_str() == Some(m.table.as_str()));
        if !plain_name || m.table.ends_with(".gz") || !m.table.ends_with(".ron") {
            return Err(ShardMergeError::BadShard {
                path: mp,
                index: shard.index,
                count: shard.count,
                why: format!(
                    "its manifest's table `{}` is not the file name of a table (.ron) next to \
                     the log",
                    m.table
                ),
            });
        }
        if m.shard != shard {
            return Err(ShardMergeError::BadShard {
                path: mp,
                index: shard.index,
                count: shard.count,
                why: format!("its manifest says shard {} of {}", m.shard.index, m.shard.count),
            });
        }
        if let Some((fp, f)) = &first {
            let mismatch = |what, a: String, b: String| ShardMergeError::Mismatch {
                first: fp.clone(),
                other: mp.clone(),
                what,
                a,
                b,
            };
            if f.shard.count != m.shard.count {
                return Err(mismatch(
                    "shard count",
                    f.shard.count.to_string(),
                    m.shard.count.to_string(),
                ));
            }
            if (&f.device, f.compute_capability) != (&m.device, m.compute_capability) {
                return Err(mismatch("GPU model", f.device.clone(), m.device.clone()));
            }
            if f.template_hash != m.template_hash {
                return Err(mismatch(
                    "template version",
                    short(&f.template_hash).to_string(),
                    short(&m.template_hash).to_string(),
                ));
            }
            if f.campaign_keys != m.campaign_keys {
                return Err(mismatch(
                    "shape set",
                    format!("{} keys", f.campaign_keys.len()),
                    format!("{} keys", m.campaign_keys.len()),
                ));
            }
        } else {
            first = Some((mp.clone(), m.clone()));
        }
        if !report.present.iter().any(|x| x.shard == m.shard) {
            report.present.push(m);
        }
    }
    if let Some((_, shard)) = named {
        report.count = shard.count;
        report.present.sort_by_key(|m| m.shard.index);
        report.without_manifest.retain(|i| !report.present.iter().any(|m| m.shard.index == *i));
        report.without_manifest.sort_unstable();
        report.missing = (0..shard.count)
            .filter(|i| {
                !report.present.iter().any(|m| m.shard.index == *i)
                    && !report.without_manifest.contains(i)
            })
            .collect();
        report.unfinished =
            report.present.iter().filter(|m| !m.finished).map(|m| m.shard.index).collect();
    }
    Ok(report)
}

/// Write records as a new log at `path` (atomically: temporary file, then rename; through a
/// symbolic link to its target), gzip-compressed when `path` ends in `.gz`.
pub fn write(path: &Path, records: &[Record]) -> Result<(), MergeError> {
    let err = |error| MergeError::Write { path: path.to_path_buf(), error };
    let bytes = encode(path, records)?;
    crate::fsio::create_parent_dir(path).map_err(err)?;
    crate::fsio::write_atomic(path, &bytes).map_err(err)
}

/// The bytes [`write`] stores at `path`: one JSON record per line, gzip-compressed when the name
/// ends in `.gz`.
pub fn encode(path: &Path, records: &[Record]) -> Result<Vec<u8>, MergeError> {
    let err = |error| MergeError::Write { path: path.to_path_buf(), error };
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
    Ok(bytes)
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
        let e = merge(&[a.clone(), c]).unwrap_err().to_string();
        assert!(e.contains("different template versions"), "{e}");
        // a misspelled log is an error naming it, alone or beside real ones
        for logs in [vec![d.path().join("missing.jsonl")], vec![a, d.path().join("missing.jsonl")]]
        {
            let e = merge(&logs).unwrap_err().to_string();
            assert!(e.contains("missing.jsonl") && e.contains("no such file"), "{e}");
        }
    }

    fn text_log(dir: &Path, name: &str, recs: &[Record]) -> PathBuf {
        let p = dir.join(name);
        let text: String = recs.iter().map(|r| serde_json::to_string(r).unwrap() + "\n").collect();
        std::fs::write(&p, text).unwrap();
        p
    }

    /// 100k records (and the same 100k again from a second shard) merge in one linear pass;
    /// the old per-record search over the merged list took minutes here.
    #[test]
    fn merges_100k_records_linearly() {
        let d = tempfile::tempdir().unwrap();
        let one = record(1, Some(3.0));
        let recs: Vec<Record> = (1..=100_000)
            .map(|m| Record { key: crate::table::TableKey { m, ..one.key.clone() }, ..one.clone() })
            .collect();
        let a = text_log(d.path(), "a.jsonl", &recs);
        let b = text_log(d.path(), "b.jsonl", &recs[50_000..]);
        let m = merge(&[a, b]).unwrap();
        assert_eq!(m.len(), 100_000);
        assert!(m.windows(2).all(|w| w[0].key < w[1].key));
    }

    /// A log that a tune resumed across a template change holds two hashes: the message names
    /// that file and the line where the second version starts, the line it disagrees with, and
    /// how to proceed.
    #[test]
    fn template_mismatch_names_the_right_file_and_line_and_the_way_out() {
        let d = tempfile::tempdir().unwrap();
        let a = text_log(d.path(), "a.jsonl", &[record(1, Some(3.0)), record(2, Some(3.0))]);
        let newer = Record { template_hash: "0123456789abcdef0123".into(), ..record(4, Some(3.0)) };
        let b = text_log(d.path(), "b.jsonl", &[record(8, Some(3.0)), newer.clone()]);
        let e = merge(&[a.clone(), b]).unwrap_err().to_string();
        assert!(e.contains("b.jsonl:2: a sm90 record made with templates 0123456789abcdef"), "{e}");
        assert!(e.contains("but ") && e.contains("a.jsonl:1 used h"), "{e}");
        assert!(e.contains("grep -v '\"template_hash\":\"") && e.contains("re-tune"), "{e}");
        // One resumed log on its own: the same file on both sides, with their lines.
        let c = text_log(d.path(), "c.jsonl", &[record(1, Some(3.0)), record(2, None), newer]);
        let e = merge(&[c]).unwrap_err().to_string();
        assert!(e.contains("c.jsonl:3: a sm90 record") && e.contains("c.jsonl:1 used"), "{e}");
        // Another GPU: named by file and line too.
        let other = Record { device: "NVIDIA H100".into(), ..record(3, Some(3.0)) };
        let g = text_log(d.path(), "g.jsonl", &[record(5, Some(3.0)), other]);
        let e = merge(&[a, g]).unwrap_err().to_string();
        assert!(
            e.contains("g.jsonl:2: a record from NVIDIA H100") && e.contains("a.jsonl:1"),
            "{e}"
        );
    }

    /// Shards of one campaign: missing and unfinished ones are named; shards of another shape
    /// set, GPU model or template version are refused in one line naming both manifests.
    #[test]
    fn shard_manifests_are_checked() {
        use crate::tune::shard::{Manifest, Shard, MANIFEST_SCHEMA_VERSION};
        let d = tempfile::tempdir().unwrap();
        let keys: Vec<_> = [1, 2, 4].iter().map(|m| record(*m, None).key).collect();
        let shard = |index: u32, finished: bool| {
            let s = Shard { index, count: 4 };
            let log = d.path().join(s.file_name("x-w4a16", "jsonl"));
            let m = Manifest {
                schema_version: MANIFEST_SCHEMA_VERSION,
                shard: s,
                device: "NVIDIA H200".into(),
                compute_capability: (9, 0),
                template_hash: "h".into(),
                campaign_keys: keys.clone(),
                keys: vec![keys[index as usize % 3].clone()],
                finished,
                table: s.file_name("x", "ron"),
            };
            m.save(&Manifest::path_of_log(&log)).unwrap();
            (log, m)
        };
        let (a, _) = shard(0, true);
        let (b, _) = shard(2, false);
        let plain = d.path().join("plain.jsonl");
        let r = check_shards(&[a.clone(), b.clone(), plain.clone()]).unwrap();
        assert_eq!((r.count, r.missing.clone(), r.unfinished.clone()), (4, vec![1, 3], vec![2]));
        assert_eq!(check_shards(&[plain]).unwrap(), ShardReport::default());
        let (c, mut m) = shard(3, true);
        m.campaign_keys.pop();
        m.save(&Manifest::path_of_log(&c)).unwrap();
        let e = check_shards(&[a.clone(), c]).unwrap_err().to_string();
        assert!(e.contains("shape set differs: 3 keys vs 2 keys") && !e.contains('\n'), "{e}");
        let (c, mut m) = shard(3, true);
        m.device = "NVIDIA H100".into();
        m.save(&Manifest::path_of_log(&c)).unwrap();
        let e = check_shards(&[a, c]).unwrap_err().to_string();
        assert!(e.contains("GPU model differs: NVIDIA H200 vs NVIDIA H100"), "{e}");
        assert!(e.contains("x-w4a16.shard-0-of-4.manifest.json"), "{e}");
        // a shard log without its manifest counts by its name: present, not known to have
        // finished, and the other shards of its count missing
        let lone = Shard { index: 1, count: 2 };
        let e = tempfile::tempdir().unwrap();
        let log = e.path().join(lone.file_name("x-w4a16", "jsonl"));
        let r = check_shards(std::slice::from_ref(&log)).unwrap();
        assert_eq!((r.count, r.missing, r.without_manifest), (2, vec![0], vec![1]));
        assert!(r.present.is_empty() && r.unfinished.is_empty());
        let other = e.path().join(Shard { index: 0, count: 3 }.file_name("x-w4a16", "jsonl"));
        let err = check_shards(&[log, other]).unwrap_err().to_string();
        assert!(err.contains("shard count differs: 2 vs 3"), "{err}");
        // a manifest that says another shard than its name, and a count past the bound
        let (f, mut m) = shard(1, true);
        m.shard = Shard { index: 5, count: 4 };
        m.save(&Manifest::path_of_log(&f)).unwrap();
        let err = check_shards(&[f]).unwrap_err().to_string();
        assert!(err.contains("name says shard 1 of 4: its manifest says shard 5 of 4"), "{err}");
        let huge = e.path().join("x-w4a16.shard-0-of-4294967295.jsonl");
        let err = check_shards(&[huge]).unwrap_err().to_string();
        assert!(err.contains("shard 0 of 4294967295") && err.contains("at most 4096"), "{err}");
        // the partial table a manifest names is a file name next to its log
        for bad in ["", "/etc/passwd", "../x.ron", "sub/x.ron", "x.jsonl"] {
            let (f, mut m) = shard(1, true);
            m.table = bad.into();
            m.save(&Manifest::path_of_log(&f)).unwrap();
            let err = check_shards(&[f]).unwrap_err().to_string();
            assert!(err.contains("manifest.json") && err.contains("not the file name"), "{err}");
        }
    }

    #[test]
    fn a_torn_last_line_is_a_warning_of_the_merge() {
        let d = tempfile::tempdir().unwrap();
        let a = text_log(d.path(), "a.jsonl", &[record(1, Some(3.0))]);
        let mut bytes = std::fs::read(&a).unwrap();
        bytes.extend_from_slice(serde_json::to_string(&record(2, Some(3.0))).unwrap().as_bytes());
        std::fs::write(&a, bytes).unwrap();
        let m = merge_logs(&[a]).unwrap();
        assert_eq!(m.records.len(), 1);
        assert!(m.warnings[0].contains("a.jsonl:2: the last record has no newline"), "{m:?}");
    }

    /// `--out` through a link writes the link's target; a device is refused.
    #[cfg(unix)]
    #[test]
    fn output_links_are_written_through() {
        let d = tempfile::tempdir().unwrap();
        let real = d.path().join("real.jsonl");
        let link = d.path().join("link.jsonl");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        write(&link, &[record(1, Some(3.0))]).unwrap();
        assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink());
        assert_eq!(log::read(&real).unwrap().len(), 1);
        let e = write(Path::new("/dev/null"), &[record(1, Some(3.0))]).unwrap_err().to_string();
        assert!(e.contains("/dev/null is not a regular file"), "{e}");
    }
}
