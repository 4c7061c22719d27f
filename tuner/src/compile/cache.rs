//! On-disk CUBIN cache: one entry per (source, options, arch, NVRTC build), written atomically.
//!
//! Layout: `<dir>/<key>.cubin` and `<dir>/<key>.json` (metadata). Each file is written to a
//! temporary name in the same folder and renamed into place, the metadata last, so a reader sees
//! either a complete entry or none, even if the writer is killed.
//!
//! The cache holds GPU code that serving code runs, so it is trusted only when nobody else can
//! write it: the folder is created owner-only (0700), a folder that is group- or world-writable
//! or owned by another user is not used (kernels are compiled in memory instead, and
//! [`DiskCache::warning`] says why), and every entry's metadata carries the SHA-256 of its cubin,
//! checked before the cubin is handed out (a mismatch is a miss: the kernel is recompiled).
//!
//! A trusted folder this process cannot write (read-only, or a store that failed, e.g. a full
//! disk) is still read: its entries load, new kernels stay in memory, and the warning says so
//! once instead of every compile failing.

use super::stats::PtxasStats;
use crate::fsio::{explain_create_dir, remove_stale_temp_files, write_atomic, STALE_TEMP_AGE};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};

/// Version of the metadata format; entries of another version are ignored (recompiled).
/// Version 2 added the cubin's SHA-256.
pub const CACHE_SCHEMA_VERSION: u32 = 2;

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

/// The metadata file: the caller's metadata and the SHA-256 (hex) of the cubin it describes.
#[derive(Debug, Serialize, Deserialize)]
struct StoredMeta {
    #[serde(flatten)]
    meta: CacheMeta,
    cubin_sha256: String,
}

fn sha256_hex(bytes: &[u8]) -> String {
    crate::template::source::hex(&Sha256::digest(bytes))
}

#[derive(Debug, Clone)]
pub struct DiskCache {
    dir: PathBuf,
    /// Why the folder is not used (entries are neither read nor written), if it is not.
    untrusted: Option<String>,
    /// Why nothing is stored in it (entries are still read): the folder was not writable at
    /// open, or a store failed since.
    unwritable: std::sync::OnceLock<String>,
}

impl DiskCache {
    /// Use `dir`, creating it (owner-only) when missing. A folder that others can write is not
    /// used: the cache then holds nothing and stores nothing, and [`DiskCache::warning`] says
    /// why (the caller compiles in memory). Stale temporary files of a killed writer are removed.
    pub fn new(dir: impl Into<PathBuf>) -> std::io::Result<Self> {
        Self::open(dir.into(), probe_writable)
    }

    /// [`DiskCache::new`] with the writability probe `probe` (tests answer it).
    fn open(dir: PathBuf, probe: fn(&Path) -> std::io::Result<()>) -> std::io::Result<Self> {
        create_private_dir(&dir)?;
        let untrusted = untrusted_reason(&dir);
        let unwritable = std::sync::OnceLock::new();
        if untrusted.is_none() {
            remove_stale_temp_files(&dir, None, STALE_TEMP_AGE);
            if let Err(e) = probe(&dir) {
                let _ = unwritable.set(format!(
                    "cubin cache {} is not writable ({e}): its kernels are read, new ones are \
                     compiled in memory only",
                    dir.display()
                ));
            }
        }
        Ok(Self { dir, untrusted, unwritable })
    }

    /// `$FP4TUNE_CACHE`, else `$XDG_CACHE_HOME/fp4tune/cubin`, else `~/.cache/fp4tune/cubin`, else
    /// a per-user folder under the temporary folder (`fp4tune-<uid>/cubin`; its owner and mode are
    /// checked like any other cache folder's). An empty variable counts as unset, and
    /// `XDG_CACHE_HOME` or `HOME` that is not an absolute path too (the cache must not move with
    /// the working folder).
    pub fn default_dir() -> PathBuf {
        Self::dir_from(|name| std::env::var_os(name))
    }

    /// [`DiskCache::default_dir`] from the environment `var`.
    fn dir_from(var: impl Fn(&str) -> Option<std::ffi::OsString>) -> PathBuf {
        let set = |name: &str| var(name).filter(|v| !v.is_empty()).map(PathBuf::from);
        if let Some(d) = set("FP4TUNE_CACHE") {
            return d;
        }
        set("XDG_CACHE_HOME")
            .filter(|p| p.is_absolute())
            .or_else(|| set("HOME").filter(|p| p.is_absolute()).map(|h| h.join(".cache")))
            .map(|base| base.join("fp4tune"))
            .unwrap_or_else(|| {
                let user = current_uid().map_or_else(|| "user".to_string(), |u| u.to_string());
                // a relative TMPDIR would move the cache with the working folder
                let tmp = Some(std::env::temp_dir()).filter(|t| t.is_absolute());
                tmp.unwrap_or_else(|| PathBuf::from("/tmp")).join(format!("fp4tune-{user}"))
            })
            .join("cubin")
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Why the folder is not used as a cache (kernels are compiled in memory), or why nothing is
    /// stored in it (read-only, a store that failed), for the caller to print; `None` when it is
    /// read and written.
    pub fn warning(&self) -> Option<&str> {
        self.untrusted.as_deref().or_else(|| self.unwritable.get().map(String::as_str))
    }

    /// Whether entries are read from the folder (a trusted one, writable or not).
    pub fn readable(&self) -> bool {
        self.untrusted.is_none()
    }

    /// Whether new entries are stored (a trusted folder whose writes have not failed).
    pub fn writable(&self) -> bool {
        self.untrusted.is_none() && self.unwritable.get().is_none()
    }

    /// The entry for `key`, if complete, of our schema version, and its cubin matches the
    /// SHA-256 in its metadata.
    pub fn get(&self, key: &str) -> Option<(CacheMeta, Vec<u8>)> {
        if !self.readable() {
            return None;
        }
        // regular files only: a FIFO or device planted in the folder is a miss, not a read that
        // never ends
        let read = |path: PathBuf| crate::fsio::read_input_bytes(&path).ok();
        let meta = read(self.dir.join(format!("{key}.json")))?;
        // The version first, so that older metadata (without a hash) is a miss, not a parse error.
        #[derive(Deserialize)]
        struct Version {
            schema_version: u32,
        }
        let v: Version = serde_json::from_slice(&meta).ok()?;
        if v.schema_version != CACHE_SCHEMA_VERSION {
            return None;
        }
        let stored: StoredMeta = serde_json::from_slice(&meta).ok()?;
        let cubin = read(self.dir.join(format!("{key}.cubin")))?;
        if cubin.is_empty() || sha256_hex(&cubin) != stored.cubin_sha256 {
            return None;
        }
        Some((stored.meta, cubin))
    }

    /// Whether an entry for `key` is stored (its metadata is present; `get` still checks it).
    pub fn contains(&self, key: &str) -> bool {
        self.readable() && self.dir.join(format!("{key}.json")).is_file()
    }

    /// Store an entry atomically (cubin first, metadata with the cubin's SHA-256 last); returns
    /// whether it was stored. Does nothing when the folder is not used or not writable (see
    /// [`DiskCache::warning`]). A store that fails (a full disk, the folder made read-only since)
    /// is not an error of the kernel, which compiled: the cache stops storing and its warning
    /// says why.
    pub fn put(&self, key: &str, meta: &CacheMeta, cubin: &[u8]) -> bool {
        if !self.writable() {
            return false;
        }
        let stored = StoredMeta { meta: meta.clone(), cubin_sha256: sha256_hex(cubin) };
        let json = serde_json::to_vec_pretty(&stored).expect("cache metadata serializes");
        let res = write_atomic(&self.dir.join(format!("{key}.cubin")), cubin)
            .and_then(|()| write_atomic(&self.dir.join(format!("{key}.json")), &json));
        match res {
            Ok(()) => true,
            // a folder that will not take files (no permission, read-only, full): stop storing
            Err(e) if lasting(&e) => {
                let _ = self.unwritable.set(format!(
                    "storing a kernel in the cubin cache {} failed ({e}): kernels compiled from \
                     now on stay in memory only",
                    self.dir.display()
                ));
                false
            }
            // anything else (another process's file in the way) costs this entry only
            Err(_) => false,
        }
    }
}

/// Whether a failed store means the folder will take no file: no permission, a read-only file
/// system, no space or quota left.
fn lasting(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(e.kind(), PermissionDenied | ReadOnlyFilesystem | StorageFull | QuotaExceeded)
}

/// Whether this process can create files in `dir`: a file created and removed at once (its
/// name unique between processes, [`crate::fsio::unique`]; a name taken is tried again).
fn probe_writable(dir: &Path) -> std::io::Result<()> {
    let mut tries = 0;
    loop {
        let probe =
            dir.join(format!(".writable.{}.{}.tmp", std::process::id(), crate::fsio::unique()));
        match std::fs::OpenOptions::new().write(true).create_new(true).open(&probe) {
            Ok(_) => return std::fs::remove_file(&probe),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && tries < 3 => tries += 1,
            Err(e) => return Err(e),
        }
    }
}

/// Create `dir` and its missing parents owner-only (0700 on Unix).
fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    if std::fs::symlink_metadata(dir).is_ok_and(|m| m.file_type().is_symlink()) && !dir.exists() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!("{} is a link to a folder that does not exist", dir.display()),
        ));
    }
    let mut b = std::fs::DirBuilder::new();
    b.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut b, 0o700);
    b.create(dir).map_err(|e| explain_create_dir(dir, e))
}

/// The effective user id of this process (Linux: the owner of `/proc/self`).
fn current_uid() -> Option<u32> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata("/proc/self").ok().map(|m| m.uid())
    }
    #[cfg(not(unix))]
    {
        None
    }
}

/// Why `dir` must not be trusted with GPU code others could plant, if it must not.
fn untrusted_reason(dir: &Path) -> Option<String> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        let m = match std::fs::metadata(dir) {
            Ok(m) => m,
            Err(e) => {
                return Some(format!("cubin cache {}: {e}; compiling in memory", dir.display()))
            }
        };
        if !m.is_dir() {
            return Some(format!(
                "cubin cache {} is not a folder; compiling in memory",
                dir.display()
            ));
        }
        let mode = m.mode() & 0o7777;
        if mode & 0o022 != 0 {
            return Some(format!(
                "cubin cache {} is group- or world-writable (mode {mode:o}): not used, compiling in \
                 memory (others could plant GPU code there; fix: chmod 700 {})",
                dir.display(),
                dir.display()
            ));
        }
        if let Some(uid) = current_uid() {
            if m.uid() != uid {
                return Some(format!(
                    "cubin cache {} is owned by user id {}, not by this user ({uid}): not used, \
                     compiling in memory (set FP4TUNE_CACHE to a folder of your own)",
                    dir.display(),
                    m.uid()
                ));
            }
        }
        None
    }
    #[cfg(not(unix))]
    {
        let _ = dir;
        None
    }
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
        assert!(c.put("abc", &meta(), b"\x7fELF..."));
        let (m, b) = c.get("abc").unwrap();
        assert_eq!(m, meta());
        assert_eq!(b, b"\x7fELF...");
        // A FIFO in place of an entry's file is a miss, not a read that waits for ever.
        #[cfg(unix)]
        {
            assert!(c.put("fifo", &meta(), b"\x7fELF"));
            for ext in ["cubin", "json"] {
                let f = c.dir().join(format!("fifo.{ext}"));
                std::fs::remove_file(&f).unwrap();
                let made = std::process::Command::new("mkfifo").arg(&f).status().unwrap();
                assert!(made.success());
                assert!(c.get("fifo").is_none());
                std::fs::remove_file(&f).unwrap();
            }
        }
        // A cubin without metadata (writer killed between the two renames) is no entry.
        std::fs::write(c.dir().join("half.cubin"), b"x").unwrap();
        assert!(c.get("half").is_none());
        // Metadata of another schema version is ignored.
        let mut m2 = meta();
        m2.schema_version = 99;
        assert!(c.put("old", &m2, b"x"));
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

    /// A cubin that does not match the SHA-256 in its metadata (truncated, corrupted, planted)
    /// is a miss, and so is metadata of version 1 (no hash): the kernel is recompiled.
    #[test]
    fn cubin_is_checked_against_its_sha256() {
        let dir = tempfile::tempdir().unwrap();
        let c = DiskCache::new(dir.path()).unwrap();
        assert!(c.put("k1", &meta(), b"\x7fELF good"));
        assert!(c.get("k1").is_some());
        std::fs::write(c.dir().join("k1.cubin"), b"\x7fELF evil").unwrap();
        assert!(c.get("k1").is_none(), "a changed cubin must not load");
        std::fs::write(c.dir().join("k1.cubin"), b"\x7fELF go").unwrap();
        assert!(c.get("k1").is_none(), "a truncated cubin must not load");
        // Recompiling stores a fresh entry that loads again.
        assert!(c.put("k1", &meta(), b"\x7fELF good"));
        assert_eq!(c.get("k1").unwrap().1, b"\x7fELF good");
        // A version-1 entry (no hash) is not trusted.
        let mut v1 = serde_json::to_value(meta()).unwrap();
        v1["schema_version"] = 1.into();
        std::fs::write(c.dir().join("k2.json"), v1.to_string()).unwrap();
        std::fs::write(c.dir().join("k2.cubin"), b"\x7fELF").unwrap();
        assert!(c.get("k2").is_none());
    }

    #[cfg(unix)]
    #[test]
    fn cache_folder_is_private_and_others_folders_are_not_used() {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let dir = tempfile::tempdir().unwrap();
        let fresh = dir.path().join("a/b/cubin");
        let c = DiskCache::new(&fresh).unwrap();
        assert_eq!(std::fs::metadata(&fresh).unwrap().mode() & 0o777, 0o700);
        assert!(c.warning().is_none(), "{:?}", c.warning());

        // A world-writable folder: not read, not written, and a warning that says why.
        let shared = dir.path().join("shared");
        std::fs::create_dir(&shared).unwrap();
        let trusted = DiskCache::new(&shared).unwrap();
        assert!(trusted.put("k", &meta(), b"\x7fELF"));
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o777)).unwrap();
        let c = DiskCache::new(&shared).unwrap();
        let w = c.warning().expect("a warning for a world-writable folder");
        assert!(w.contains("world-writable") && w.contains("compiling in memory"), "{w}");
        assert!(c.get("k").is_none(), "a planted entry in a shared folder must not load");
        assert!(!c.put("k2", &meta(), b"\x7fELF"));
        assert!(!shared.join("k2.cubin").exists());
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o770)).unwrap();
        assert!(DiskCache::new(&shared).unwrap().warning().is_some(), "group-writable too");

        // A folder of another user (only root can make one here).
        if current_uid() == Some(0) {
            let theirs = dir.path().join("theirs");
            std::fs::create_dir(&theirs).unwrap();
            std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
            let c = DiskCache::new(&theirs).unwrap();
            let w = c.warning().expect("a warning for another user's folder");
            assert!(w.contains("owned by user id 65534"), "{w}");
        }
    }

    /// A trusted folder this process cannot write is read, stores nothing, and says so once; a
    /// store that fails for good later (no permission, no space) stops the storing with a
    /// warning instead of failing the kernel; one that fails for its entry alone costs that entry.
    #[cfg(unix)]
    #[test]
    fn an_unwritable_folder_is_read_and_not_written() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        // A store that fails for its entry (a folder where the cubin goes): that entry only.
        let c = DiskCache::new(dir.path()).unwrap();
        assert!(c.put("k", &meta(), b"\x7fELF"));
        std::fs::create_dir(dir.path().join("k2.cubin")).unwrap();
        assert!(!c.put("k2", &meta(), b"\x7fELF"));
        assert!(c.warning().is_none() && c.writable());
        assert!(c.put("k3", &meta(), b"\x7fELF"));
        // The failures that last.
        use std::io::ErrorKind::*;
        for (kind, stops) in [
            (PermissionDenied, true),
            (StorageFull, true),
            (AlreadyExists, false),
            (NotFound, false),
        ] {
            assert_eq!(lasting(&std::io::Error::from(kind)), stops, "{kind:?}");
        }
        // The folder made read-only under an open cache (where permissions bind: not as root).
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o500)).unwrap();
        if probe_writable(dir.path()).is_err() {
            assert!(!c.put("k4", &meta(), b"\x7fELF"));
            let w = c.warning().expect("a lasting failure is a warning").to_string();
            assert!(w.contains("stay in memory only") && w.contains("Permission denied"), "{w}");
            assert!(!c.writable() && c.readable());
            assert_eq!(c.get("k").unwrap().1, b"\x7fELF", "entries are still read");
        }
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();

        // A folder that is read-only at open (the probe answers as a read-only file system
        // would: permissions do not bind root): its entries are read, nothing is stored.
        let ro = dir.path().join("ro");
        assert!(DiskCache::new(&ro).unwrap().put("k", &meta(), b"\x7fELF"));
        let read_only =
            |_: &Path| Err(std::io::Error::from(std::io::ErrorKind::ReadOnlyFilesystem));
        let c = DiskCache::open(ro.clone(), read_only).unwrap();
        let w = c.warning().expect("a read-only folder is a warning");
        assert!(w.contains("is not writable") && w.contains("are read"), "{w}");
        assert!(c.readable() && !c.writable());
        assert_eq!(c.get("k").unwrap().1, b"\x7fELF");
        assert!(c.contains("k"));
        assert!(!c.put("k3", &meta(), b"\x7fELF") && !ro.join("k3.json").exists());
        assert!(DiskCache::new(&ro).unwrap().warning().is_none());
    }

    /// A cache folder under a file, or a link to a folder that does not exist, is a one-line
    /// error naming it.
    #[cfg(unix)]
    #[test]
    fn cache_folders_that_cannot_be_made_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("plain");
        std::fs::write(&file, b"x").unwrap();
        let e = DiskCache::new(file.join("cubin")).unwrap_err().to_string();
        assert!(e.contains("plain exists and is not a folder"), "{e}");
        let dangling = dir.path().join("dangling");
        std::os::unix::fs::symlink(dir.path().join("nowhere"), &dangling).unwrap();
        let e = DiskCache::new(&dangling).unwrap_err().to_string();
        assert!(e.contains("dangling is a link to a folder that does not exist"), "{e}");
    }

    /// The default folder: an empty variable is unset, a relative XDG_CACHE_HOME or HOME is not
    /// used, FP4TUNE_CACHE is taken as given.
    #[test]
    fn default_folder_ignores_empty_and_relative_homes() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                pairs.iter().find(|(n, _)| *n == name).map(|(_, v)| std::ffi::OsString::from(v))
            }
        };
        let tmp = std::env::temp_dir();
        let d = DiskCache::dir_from(env(&[("FP4TUNE_CACHE", "rel/c"), ("HOME", "/h")]));
        assert_eq!(d, PathBuf::from("rel/c"));
        let d = DiskCache::dir_from(env(&[("FP4TUNE_CACHE", ""), ("XDG_CACHE_HOME", "/x")]));
        assert_eq!(d, PathBuf::from("/x/fp4tune/cubin"));
        let d = DiskCache::dir_from(env(&[("XDG_CACHE_HOME", ""), ("HOME", "/h")]));
        assert_eq!(d, PathBuf::from("/h/.cache/fp4tune/cubin"));
        let d = DiskCache::dir_from(env(&[("XDG_CACHE_HOME", "x"), ("HOME", "/h")]));
        assert_eq!(d, PathBuf::from("/h/.cache/fp4tune/cubin"));
        for pairs in [&[("HOME", "")][..], &[("HOME", "h"), ("XDG_CACHE_HOME", "")], &[]] {
            let d = DiskCache::dir_from(env(pairs));
            assert!(d.starts_with(&tmp) && d.ends_with("cubin") && d.is_absolute(), "{d:?}");
        }
    }

    /// Opening the cache folder sweeps the temporary files a killed writer left in it.
    #[test]
    fn opening_the_folder_removes_stale_temp_files() {
        let dir = tempfile::tempdir().unwrap();
        let stale = dir.path().join(".k.cubin.4242.7.tmp");
        let f = std::fs::File::create(&stale).unwrap();
        f.set_modified(std::time::SystemTime::now() - 2 * STALE_TEMP_AGE).unwrap();
        let fresh = dir.path().join(".j.cubin.4243.0.tmp");
        std::fs::File::create(&fresh).unwrap();
        DiskCache::new(dir.path()).unwrap();
        assert!(!stale.exists() && fresh.exists());
    }
}
