//! On-disk CUBIN cache: one entry per (source, options, arch, NVRTC version), written atomically.
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

use super::stats::PtxasStats;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Version of the metadata format; entries of another version are ignored (recompiled).
/// Version 2 added the cubin's SHA-256.
pub const CACHE_SCHEMA_VERSION: u32 = 2;

/// Temporary files of [`write_atomic`] older than this are left by a killed writer and removed.
pub const STALE_TEMP_AGE: Duration = Duration::from_secs(3600);

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
}

impl DiskCache {
    /// Use `dir`, creating it (owner-only) when missing. A folder that others can write is not
    /// used: the cache then holds nothing and stores nothing, and [`DiskCache::warning`] says
    /// why (the caller compiles in memory). Stale temporary files of a killed writer are removed.
    pub fn new(dir: impl Into<PathBuf>) -> std::io::Result<Self> {
        let dir = dir.into();
        create_private_dir(&dir)?;
        let untrusted = untrusted_reason(&dir);
        if untrusted.is_none() {
            remove_stale_temp_files(&dir, None, STALE_TEMP_AGE);
        }
        Ok(Self { dir, untrusted })
    }

    /// `$FP4TUNE_CACHE`, else `$XDG_CACHE_HOME/fp4tune/cubin`, else `~/.cache/fp4tune/cubin`, else
    /// a per-user folder under the temporary folder (`fp4tune-<uid>/cubin`; its owner and mode are
    /// checked like any other cache folder's).
    pub fn default_dir() -> PathBuf {
        if let Some(d) = std::env::var_os("FP4TUNE_CACHE") {
            return PathBuf::from(d);
        }
        std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
            .map(|base| base.join("fp4tune"))
            .unwrap_or_else(|| {
                let user = current_uid().map_or_else(|| "user".to_string(), |u| u.to_string());
                std::env::temp_dir().join(format!("fp4tune-{user}"))
            })
            .join("cubin")
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Why the folder is not used as a cache (kernels are compiled in memory), for the caller to
    /// print; `None` when it is used.
    pub fn warning(&self) -> Option<&str> {
        self.untrusted.as_deref()
    }

    /// The entry for `key`, if complete, of our schema version, and its cubin matches the
    /// SHA-256 in its metadata.
    pub fn get(&self, key: &str) -> Option<(CacheMeta, Vec<u8>)> {
        if self.untrusted.is_some() {
            return None;
        }
        let meta = std::fs::read(self.dir.join(format!("{key}.json"))).ok()?;
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
        let cubin = std::fs::read(self.dir.join(format!("{key}.cubin"))).ok()?;
        if cubin.is_empty() || sha256_hex(&cubin) != stored.cubin_sha256 {
            return None;
        }
        Some((stored.meta, cubin))
    }

    /// Whether an entry for `key` is stored (its metadata is present; `get` still checks it).
    pub fn contains(&self, key: &str) -> bool {
        self.untrusted.is_none() && self.dir.join(format!("{key}.json")).is_file()
    }

    /// Store an entry atomically (cubin first, metadata with the cubin's SHA-256 last). Does
    /// nothing when the folder is not used (see [`DiskCache::warning`]).
    pub fn put(&self, key: &str, meta: &CacheMeta, cubin: &[u8]) -> std::io::Result<()> {
        if self.untrusted.is_some() {
            return Ok(());
        }
        write_atomic(&self.dir.join(format!("{key}.cubin")), cubin)?;
        let stored = StoredMeta { meta: meta.clone(), cubin_sha256: sha256_hex(cubin) };
        let json = serde_json::to_vec_pretty(&stored).map_err(std::io::Error::other)?;
        write_atomic(&self.dir.join(format!("{key}.json")), &json)
    }
}

/// Create `dir` and its missing parents owner-only (0700 on Unix).
fn create_private_dir(dir: &Path) -> std::io::Result<()> {
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

/// A clearer error for a folder that cannot be created because a component is a file.
fn explain_create_dir(dir: &Path, e: std::io::Error) -> std::io::Error {
    if e.kind() != std::io::ErrorKind::AlreadyExists
        && e.kind() != std::io::ErrorKind::NotADirectory
    {
        return e;
    }
    let blocker = dir.ancestors().find(|a| a.exists() && !a.is_dir());
    match blocker {
        Some(b) => {
            std::io::Error::new(e.kind(), format!("{} exists and is not a folder", b.display()))
        }
        None => e,
    }
}

/// Create the folder `path` will be written into (its missing parents too), with a clear error
/// when part of it exists as a file ("X exists and is not a folder", not "File exists").
pub fn create_parent_dir(path: &Path) -> std::io::Result<()> {
    match path.parent().filter(|d| !d.as_os_str().is_empty()) {
        Some(dir) => std::fs::create_dir_all(dir).map_err(|e| explain_create_dir(dir, e)),
        None => Ok(()),
    }
}

/// The file a write to `path` lands in: `path`, or the final target of the symbolic link(s) it
/// names (which may not exist yet).
fn resolve_links(path: &Path) -> std::io::Result<PathBuf> {
    let mut p = path.to_path_buf();
    for _ in 0..40 {
        match std::fs::symlink_metadata(&p) {
            Ok(m) if m.file_type().is_symlink() => {
                let target = std::fs::read_link(&p)?;
                p = match p.parent() {
                    Some(dir) if target.is_relative() => dir.join(target),
                    _ => target,
                };
            }
            Ok(_) => return Ok(p),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(p),
            Err(e) => return Err(e),
        }
    }
    Err(std::io::Error::other(format!("{}: too many levels of symbolic links", path.display())))
}

/// Write `bytes` to `path` through a temporary file in the same folder and a rename, so a reader
/// sees the old content or the new one, never a part. A symbolic link is written through (its
/// target is replaced, the link stays); a path that is not a regular file (a folder, a device,
/// a pipe) is refused, never replaced. The file is synced before the rename and its folder after
/// it. Temporary files of this naming left by a killed writer (older than [`STALE_TEMP_AGE`]) are
/// removed on the way.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let target = resolve_links(path)?;
    let existing = match std::fs::metadata(&target) {
        Ok(m) if !m.is_file() => {
            let via = if target != path {
                format!(" (the target of the link {})", path.display())
            } else {
                String::new()
            };
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("{}{via} is not a regular file", target.display()),
            ));
        }
        Ok(m) => Some(m),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(e),
    };
    let dir = match target.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = target.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    remove_stale_temp_files(&dir, Some(&name), STALE_TEMP_AGE);
    let tmp = dir.join(format!(".{name}.{}.{}.tmp", std::process::id(), unique()));
    let result = (|| {
        let mut f = std::fs::OpenOptions::new().write(true).create_new(true).open(&tmp)?;
        if let Some(m) = &existing {
            // Keep the mode of the file being replaced.
            f.set_permissions(m.permissions())?;
        }
        f.write_all(bytes)?;
        f.sync_all()?;
        drop(f);
        std::fs::rename(&tmp, &target)?;
        sync_dir(&dir)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Make a rename in `dir` durable (Unix: fsync the folder; elsewhere nothing to do).
fn sync_dir(dir: &Path) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        std::fs::File::open(dir)?.sync_all()
    }
    #[cfg(not(unix))]
    {
        let _ = dir;
        Ok(())
    }
}

/// Whether `file` is a temporary file of [`write_atomic`]'s naming (`.<name>.<pid>.<n>.tmp`),
/// for the target `name` if one is given.
fn is_our_temp_file(file: &str, name: Option<&str>) -> bool {
    let Some(inner) = file.strip_prefix('.').and_then(|f| f.strip_suffix(".tmp")) else {
        return false;
    };
    let mut parts = inner.rsplitn(3, '.');
    let (Some(n), Some(pid), Some(target)) = (parts.next(), parts.next(), parts.next()) else {
        return false;
    };
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    digits(n) && digits(pid) && !target.is_empty() && name.is_none_or(|name| name == target)
}

/// Remove temporary files of [`write_atomic`]'s naming in `dir` (for target `name`, or any) that
/// are regular files older than `age`: what a writer killed between create and rename leaves.
/// Nothing else is touched; failures are ignored (the next write tries again).
pub fn remove_stale_temp_files(dir: &Path, name: Option<&str>, age: Duration) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    let now = std::time::SystemTime::now();
    for e in entries.flatten() {
        let file = e.file_name();
        let Some(file) = file.to_str() else { continue };
        if !is_our_temp_file(file, name) {
            continue;
        }
        let Ok(m) = e.metadata() else { continue };
        let old = m
            .modified()
            .ok()
            .and_then(|t| now.duration_since(t).ok())
            .is_some_and(|elapsed| elapsed > age);
        if m.is_file() && old {
            let _ = std::fs::remove_file(e.path());
        }
    }
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

    /// A cubin that does not match the SHA-256 in its metadata (truncated, corrupted, planted)
    /// is a miss, and so is metadata of version 1 (no hash): the kernel is recompiled.
    #[test]
    fn cubin_is_checked_against_its_sha256() {
        let dir = tempfile::tempdir().unwrap();
        let c = DiskCache::new(dir.path()).unwrap();
        c.put("k1", &meta(), b"\x7fELF good").unwrap();
        assert!(c.get("k1").is_some());
        std::fs::write(c.dir().join("k1.cubin"), b"\x7fELF evil").unwrap();
        assert!(c.get("k1").is_none(), "a changed cubin must not load");
        std::fs::write(c.dir().join("k1.cubin"), b"\x7fELF go").unwrap();
        assert!(c.get("k1").is_none(), "a truncated cubin must not load");
        // Recompiling stores a fresh entry that loads again.
        c.put("k1", &meta(), b"\x7fELF good").unwrap();
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
        trusted.put("k", &meta(), b"\x7fELF").unwrap();
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o777)).unwrap();
        let c = DiskCache::new(&shared).unwrap();
        let w = c.warning().expect("a warning for a world-writable folder");
        assert!(w.contains("world-writable") && w.contains("compiling in memory"), "{w}");
        assert!(c.get("k").is_none(), "a planted entry in a shared folder must not load");
        c.put("k2", &meta(), b"\x7fELF").unwrap();
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

    #[cfg(unix)]
    #[test]
    fn atomic_write_goes_through_links_and_refuses_other_files() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("real.jsonl");
        std::fs::write(&target, b"old").unwrap();
        let link = dir.path().join("link.jsonl");
        std::os::unix::fs::symlink("real.jsonl", &link).unwrap();
        write_atomic(&link, b"new").unwrap();
        assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink());
        assert_eq!(std::fs::read(&target).unwrap(), b"new");
        // A dangling link creates its target.
        let dangling = dir.path().join("dangling");
        std::os::unix::fs::symlink(dir.path().join("made.txt"), &dangling).unwrap();
        write_atomic(&dangling, b"x").unwrap();
        assert_eq!(std::fs::read(dir.path().join("made.txt")).unwrap(), b"x");
        assert!(std::fs::symlink_metadata(&dangling).unwrap().file_type().is_symlink());

        // A device (through a link, as `--out /dev/null` would be) and a folder are refused.
        let null = dir.path().join("null");
        std::os::unix::fs::symlink("/dev/null", &null).unwrap();
        let e = write_atomic(&null, b"x").unwrap_err().to_string();
        assert!(e.contains("/dev/null") && e.contains("is not a regular file"), "{e}");
        use std::os::unix::fs::FileTypeExt;
        assert!(std::fs::metadata("/dev/null").unwrap().file_type().is_char_device());
        let sub = dir.path().join("sub");
        std::fs::create_dir(&sub).unwrap();
        let e = write_atomic(&sub, b"x").unwrap_err().to_string();
        assert!(e.contains("sub is not a regular file"), "{e}");
        assert!(sub.is_dir());

        // The mode of a replaced file is kept.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o640)).unwrap();
        write_atomic(&target, b"again").unwrap();
        assert_eq!(std::fs::metadata(&target).unwrap().permissions().mode() & 0o777, 0o640);
    }

    /// Temporary files a killed writer left (our naming, older than an hour) are removed by the
    /// next write; fresh ones (a writer at work) and other files are kept.
    #[test]
    fn stale_temp_files_of_our_naming_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let old = std::time::SystemTime::now() - Duration::from_secs(2 * 3600);
        let make = |name: &str, stale: bool| {
            let p = d.join(name);
            let f = std::fs::File::create(&p).unwrap();
            if stale {
                f.set_modified(old).unwrap();
            }
            p
        };
        let stale = make(".out.jsonl.4242.7.tmp", true);
        let fresh = make(".out.jsonl.4243.0.tmp", false);
        let other_target = make(".other.jsonl.4242.7.tmp", true);
        let not_ours = make(".out.jsonl.tmp", true);
        let user_file = make("notes.tmp", true);
        let odd = make(".out.jsonl.x.7.tmp", true);
        write_atomic(&d.join("out.jsonl"), b"records\n").unwrap();
        assert!(!stale.exists(), "a stale temp file of this target is removed");
        for kept in [&fresh, &other_target, &not_ours, &user_file, &odd] {
            assert!(kept.exists(), "{} must be kept", kept.display());
        }
        // The cache folder sweeps every stale temp file of our naming when opened.
        DiskCache::new(d).unwrap();
        assert!(!other_target.exists());
        for kept in [&fresh, &not_ours, &user_file, &odd] {
            assert!(kept.exists(), "{} must be kept", kept.display());
        }
        assert!(is_our_temp_file(".k.cubin.12.0.tmp", Some("k.cubin")));
        assert!(!is_our_temp_file(".k.cubin.12.0.tmp", Some("j.cubin")));
    }

    #[test]
    fn a_file_in_the_way_of_a_folder_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("plain");
        std::fs::write(&file, b"x").unwrap();
        let e = create_parent_dir(&file.join("sub/out.jsonl")).unwrap_err().to_string();
        assert!(e.contains("plain exists and is not a folder"), "{e}");
        let e = DiskCache::new(file.join("cubin")).unwrap_err().to_string();
        assert!(e.contains("plain exists and is not a folder"), "{e}");
    }
}
