//! On-disk CUBIN cache: one entry per (source, options, arch, NVRTC version), written atomically.
//!
//! Layout: `<dir>/<key>.cubin` and `<dir>/<key>.json` (metadata). Each file is written to a
//! temporary name in the same folder and renamed into place, the metadata last, so a reader sees
//! either a complete entry or none, even if the writer is killed.

use super::stats::PtxasStats;
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::{Path, PathBuf};

/// Version of the metadata format; entries of another version are ignored (recompiled).
pub const CACHE_SCHEMA_VERSION: u32 = 1;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct CacheMeta {
    pub schema_version: u32,
    pub kernel_name: String,
    pub arch: String,
    pub nvrtc_version: (i32, i32),
    pub stats: Option<PtxasStats>,
    pub compile_ms: f64,
    pub log: String,
}

#[derive(Debug, Clone)]
pub struct DiskCache {
    dir: PathBuf,
}

impl DiskCache {
    /// Use (and create) `dir`.
    pub fn new(dir: impl Into<PathBuf>) -> std::io::Result<Self> {
        let dir = dir.into();
        std::fs::create_dir_all(&dir)?;
        Ok(Self { dir })
    }

    /// `$FP4TUNE_CACHE`, else `$XDG_CACHE_HOME/fp4tune/cubin`, else `~/.cache/fp4tune/cubin`.
    pub fn default_dir() -> PathBuf {
        if let Some(d) = std::env::var_os("FP4TUNE_CACHE") {
            return PathBuf::from(d);
        }
        let base = std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
            .unwrap_or_else(std::env::temp_dir);
        base.join("fp4tune").join("cubin")
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The entry for `key`, if complete and of our schema version.
    pub fn get(&self, key: &str) -> Option<(CacheMeta, Vec<u8>)> {
        let meta = std::fs::read(self.dir.join(format!("{key}.json"))).ok()?;
        let meta: CacheMeta = serde_json::from_slice(&meta).ok()?;
        if meta.schema_version != CACHE_SCHEMA_VERSION {
            return None;
        }
        let cubin = std::fs::read(self.dir.join(format!("{key}.cubin"))).ok()?;
        (!cubin.is_empty()).then_some((meta, cubin))
    }

    /// Store an entry atomically (cubin first, metadata last).
    pub fn put(&self, key: &str, meta: &CacheMeta, cubin: &[u8]) -> std::io::Result<()> {
        write_atomic(&self.dir.join(format!("{key}.cubin")), cubin)?;
        let json = serde_json::to_vec_pretty(meta).map_err(std::io::Error::other)?;
        write_atomic(&self.dir.join(format!("{key}.json")), &json)
    }
}

/// Write `bytes` to `path` through a temporary file in the same folder and a rename.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = dir.join(format!(".{name}.{}.{}.tmp", std::process::id(), unique()));
    let result = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta() -> CacheMeta {
        CacheMeta {
            schema_version: CACHE_SCHEMA_VERSION,
            kernel_name: "k".into(),
            arch: "sm_90a".into(),
            nvrtc_version: (13, 0),
            stats: None,
            compile_ms: 1.5,
            log: "log".into(),
        }
    }

    #[test]
    fn roundtrip_and_incomplete_entries() {
        let dir = tempfile::tempdir().unwrap();
        let c = DiskCache::new(dir.path().join("sub")).unwrap();
        assert!(c.get("abc").is_none());
        c.put("abc", &meta(), b"\x7fELF...").unwrap();
        let (m, b) = c.get("abc").unwrap();
        assert_eq!(m, meta());
        assert_eq!(b, b"\x7fELF...");
        // A cubin without metadata (writer killed between the two renames) is no entry.
        std::fs::write(c.dir().join("half.cubin"), b"x").unwrap();
        assert!(c.get("half").is_none());
        // Metadata of another schema version is ignored.
        let mut m2 = meta();
        m2.schema_version = 99;
        c.put("old", &m2, b"x").unwrap();
        assert!(c.get("old").is_none());
        // Corrupt metadata is ignored, not a crash.
        std::fs::write(c.dir().join("bad.json"), b"{not json").unwrap();
        std::fs::write(c.dir().join("bad.cubin"), b"x").unwrap();
        assert!(c.get("bad").is_none());
        // No temporary files are left behind.
        let leftovers: Vec<_> = std::fs::read_dir(c.dir())
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
            .collect();
        assert!(leftovers.is_empty());
    }
}
