//! Writing files so that a reader sees the old content or the new one, never a part: one file
//! ([`write_atomic`]) or several that are replaced together or not at all ([`write_atomic_all`]),
//! through temporary files in the target's folder and renames; the folder a file goes into
//! ([`create_parent_dir`]); the temporary files a killed writer left ([`remove_stale_temp_files`]).
//! Reading inputs: only regular files ([`open_input`], [`read_input`], [`read_input_bytes`]), so
//! that a device, FIFO or socket given as an input file is an error, not an endless read or a
//! wait.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Temporary files of [`write_atomic`] older than this are left by a killed writer and removed.
pub const STALE_TEMP_AGE: Duration = Duration::from_secs(3600);

/// Open an input file: a regular file (or a link to one); a folder, device, FIFO or socket is an
/// error of kind `InvalidInput` that says what it is.
pub fn open_input(path: &Path) -> std::io::Result<std::fs::File> {
    let meta = std::fs::metadata(path)?;
    let t = meta.file_type();
    if !t.is_file() {
        use std::os::unix::fs::FileTypeExt;
        let what = if t.is_dir() {
            "a folder"
        } else if t.is_fifo() {
            "a FIFO"
        } else if t.is_socket() {
            "a socket"
        } else if t.is_char_device() || t.is_block_device() {
            "a device"
        } else {
            "not a regular file"
        };
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("is {what}, not a file to read"),
        ));
    }
    std::fs::File::open(path)
}

/// The bytes of an input file ([`open_input`]).
pub fn read_input_bytes(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut bytes = Vec::new();
    open_input(path)?.read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// The text of an input file ([`open_input`]; not UTF-8 is an `InvalidData` error).
pub fn read_input(path: &Path) -> std::io::Result<String> {
    use std::io::Read;
    let mut text = String::new();
    open_input(path)?.read_to_string(&mut text)?;
    Ok(text)
}

/// A clearer error for a folder that cannot be created because a component is a file.
pub(crate) fn explain_create_dir(dir: &Path, e: std::io::Error) -> std::io::Error {
    if e.kind() != std::io::ErrorKind::AlreadyExists
        && e.kind() != std::io::ErrorKind::NotADirectory
    {
        return e;
    }
    // a file, or a link that leads nowhere or to a file
    let blocker = dir.ancestors().find(|a| a.symlink_metadata().is_ok() && !a.is_dir());
    match blocker {
        Some(b) => {
            std::io::Error::new(e.kind(), format!("{} exists and is not a folder", b.display()))
        }
        None => e,
    }
}

/// Create the folder `dir` (its missing parents too), with a clear error when part of it exists
/// as a file or a dangling link ("X exists and is not a folder", not "File exists").
pub fn create_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| explain_create_dir(dir, e))
}

/// Create the folder `path` will be written into (its missing parents too), with a clear error
/// when part of it exists as a file ("X exists and is not a folder", not "File exists").
pub fn create_parent_dir(path: &Path) -> std::io::Result<()> {
    match path.parent().filter(|d| !d.as_os_str().is_empty()) {
        Some(dir) => create_dir(dir),
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
    Staged::write(path, bytes)?.commit()
}

/// Write several files as one: each is written and synced to its temporary file first (as
/// [`write_atomic`] does), and only when every one is written are they renamed into place. A
/// failure before the renames (a folder where a file goes, a full disk, no permission) leaves
/// every target as it was, removes the temporary files and names the path. Two paths that land
/// in the same file (the same path, a link to the other) are refused before anything is
/// written. A rename that fails after others succeeded (the folder removed underneath) stops
/// there and removes the remaining temporary files: the one case where some files are replaced
/// and others not.
pub fn write_atomic_all(files: &[(&Path, &[u8])]) -> std::io::Result<()> {
    // Each path's identity once (many files: no pairwise walk of the file system).
    let mut landings = std::collections::HashMap::new();
    let mut inodes = std::collections::HashMap::new();
    for (path, _) in files {
        let (landing, inode) = identity(path)?;
        let earlier =
            landings.insert(landing, *path).or_else(|| inode.and_then(|i| inodes.insert(i, *path)));
        if let Some(a) = earlier {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("{} and {} are the same file", a.display(), path.display()),
            ));
        }
    }
    let mut staged = Vec::with_capacity(files.len());
    for (path, bytes) in files {
        match Staged::write(path, bytes) {
            Ok(s) => staged.push(s),
            Err(e) => {
                staged.into_iter().for_each(Staged::discard);
                return Err(naming(path, e));
            }
        }
    }
    // Every rename first, then each folder synced once: a folder that cannot be synced (some
    // network file systems) leaves every file replaced, and says so.
    let mut dirs: Vec<PathBuf> = Vec::new();
    let mut staged = staged.into_iter();
    while let Some(s) = staged.next() {
        let target = s.target.clone();
        match s.rename() {
            Ok(dir) if !dirs.contains(&dir) => dirs.push(dir),
            Ok(_) => {}
            Err(e) => {
                staged.for_each(Staged::discard);
                return Err(naming(&target, e));
            }
        }
    }
    for d in &dirs {
        sync_dir(d).map_err(|e| {
            std::io::Error::new(
                e.kind(),
                format!("every file written, but syncing the folder {} failed: {e}", d.display()),
            )
        })?;
    }
    Ok(())
}

/// `e` with `path` in its message, unless the message names it already.
fn naming(path: &Path, e: std::io::Error) -> std::io::Error {
    let shown = path.display().to_string();
    if e.to_string().contains(&shown) {
        e
    } else {
        std::io::Error::new(e.kind(), format!("{shown}: {e}"))
    }
}

/// Whether writes to `a` and to `b` land in the same file: the same path, a symbolic link to the
/// other, or two spellings of one path (`x` and `./d/../x`; paths that do not exist yet are
/// compared by their normalized spelling); and, as a policy, two names of one existing file (a
/// hard link: a write would rename over one name and leave the other). An error names the path
/// it came from.
pub fn same_file(a: &Path, b: &Path) -> std::io::Result<bool> {
    let (la, ia) = identity(a)?;
    let (lb, ib) = identity(b)?;
    Ok(la == lb || ia.is_some() && ia == ib)
}

/// What [`same_file`] compares: where a write to `path` lands ([`landing`]) and, for an existing
/// file, its (device, inode). An error names the path.
fn identity(path: &Path) -> std::io::Result<(PathBuf, Option<(u64, u64)>)> {
    let landing = landing(path).map_err(|e| naming(path, e))?;
    #[cfg(unix)]
    let inode = std::fs::metadata(&landing).ok().map(|m| {
        use std::os::unix::fs::MetadataExt;
        (m.dev(), m.ino())
    });
    #[cfg(not(unix))]
    let inode = None;
    Ok((landing, inode))
}

/// The file a write to `path` lands in: its links resolved, its longest existing ancestor made
/// absolute (links resolved) and the rest of it normalized by name (`missing/../x` is `x`: the
/// writer creates `missing/` and lands there).
fn landing(path: &Path) -> std::io::Result<PathBuf> {
    use std::path::Component;
    let target = resolve_links(path)?;
    let target = if target.is_absolute() { target } else { std::env::current_dir()?.join(target) };
    let parts: Vec<Component> = target.components().collect();
    let mut n = parts.len();
    while n > 0 && std::fs::symlink_metadata(parts[..n].iter().collect::<PathBuf>()).is_err() {
        n -= 1;
    }
    let existing: PathBuf = parts[..n].iter().collect();
    let mut out = std::fs::canonicalize(&existing).unwrap_or(existing);
    for c in &parts[n..] {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other.as_os_str()),
        }
    }
    Ok(out)
}

/// One file written to its temporary name and synced, waiting for its rename.
struct Staged {
    tmp: PathBuf,
    target: PathBuf,
    dir: PathBuf,
}

impl Staged {
    fn write(path: &Path, bytes: &[u8]) -> std::io::Result<Staged> {
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
        let written = (|| {
            let mut f = std::fs::OpenOptions::new().write(true).create_new(true).open(&tmp)?;
            if let Some(m) = &existing {
                // Keep the mode of the file being replaced.
                f.set_permissions(m.permissions())?;
            }
            f.write_all(bytes)?;
            f.sync_all()
        })();
        let staged = Staged { tmp, target, dir };
        match written {
            Ok(()) => Ok(staged),
            Err(e) => {
                staged.discard();
                Err(e)
            }
        }
    }

    /// Rename into place, then make the rename durable.
    fn commit(self) -> std::io::Result<()> {
        sync_dir(&self.rename()?)
    }

    /// Rename into place (the temporary file removed if that fails); the folder to sync.
    fn rename(self) -> std::io::Result<PathBuf> {
        match std::fs::rename(&self.tmp, &self.target) {
            Ok(()) => Ok(self.dir),
            Err(e) => {
                self.discard();
                Err(e)
            }
        }
    }

    fn discard(self) {
        let _ = std::fs::remove_file(&self.tmp);
    }
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

/// The last part of a temporary file's name: digits unique within this process, and, through the
/// process's start time in nanoseconds, between processes of one PID in different PID
/// namespaces (containers sharing a folder, each fp4tune PID 1).
pub(crate) fn unique() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    static START: std::sync::OnceLock<u128> = std::sync::OnceLock::new();
    let start = START.get_or_init(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    });
    format!("{start}{}", N.fetch_add(1, Ordering::Relaxed))
}

#[cfg(test)]
mod input_tests {
    use super::*;

    /// Devices, FIFOs and folders are refused before anything is read; a link to a file is read.
    #[test]
    fn inputs_are_regular_files_only() {
        let dir = tempfile::tempdir().unwrap();
        let e = read_input(Path::new("/dev/zero")).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
        assert!(e.to_string().contains("a device"), "{e}");
        assert!(read_input(dir.path()).unwrap_err().to_string().contains("a folder"));
        let fifo = dir.path().join("f");
        assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
        assert!(read_input(&fifo).unwrap_err().to_string().contains("a FIFO"));
        let file = dir.path().join("t.txt");
        std::fs::write(&file, "text").unwrap();
        let link = dir.path().join("l.txt");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        assert_eq!(read_input(&link).unwrap(), "text");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        // A sweep of the folder removes every stale temp file of our naming.
        remove_stale_temp_files(d, None, STALE_TEMP_AGE);
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
    }

    /// Several files are replaced together or not at all: a folder where the second goes leaves
    /// the first as it was (and no temporary file behind); two paths of one file are refused.
    #[cfg(unix)]
    #[test]
    fn several_files_are_replaced_together_or_not_at_all() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let log = d.join("merged.jsonl");
        std::fs::write(&log, b"old log").unwrap();
        let folder = d.join("table.ron");
        std::fs::create_dir(&folder).unwrap();
        let e = write_atomic_all(&[(&log, b"new log"), (&folder, b"table")]).unwrap_err();
        assert!(e.to_string().contains("table.ron is not a regular file"), "{e}");
        assert_eq!(std::fs::read(&log).unwrap(), b"old log");
        let temps: Vec<_> = std::fs::read_dir(d)
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
            .collect();
        assert!(temps.is_empty(), "{temps:?}");

        let table = d.join("t.ron");
        write_atomic_all(&[(&log, b"new log"), (&table, b"table")]).unwrap();
        assert_eq!(std::fs::read(&log).unwrap(), b"new log");
        assert_eq!(std::fs::read(&table).unwrap(), b"table");

        // The same file twice: by path, by another spelling, through a link.
        let link = d.join("link.ron");
        std::os::unix::fs::symlink("t.ron", &link).unwrap();
        let spelled = d.join("sub/../t.ron");
        std::fs::create_dir(d.join("sub")).unwrap();
        for other in [&table, &spelled, &link] {
            let e = write_atomic_all(&[(&table, b"a"), (other, b"b")]).unwrap_err();
            assert!(e.to_string().contains("are the same file"), "{e}");
            assert_eq!(std::fs::read(&table).unwrap(), b"table");
        }
        assert!(same_file(&log, &d.join("./merged.jsonl")).unwrap());
        assert!(!same_file(&log, &table).unwrap());
        // A path whose folder does not exist yet is compared by its normalized spelling: the
        // writer creates `missing/`, so `missing/../t.ron` lands in `t.ron`.
        assert!(!same_file(&d.join("new/a.ron"), &table).unwrap());
        assert!(same_file(&d.join("missing/../t.ron"), &table).unwrap());
        assert!(same_file(&d.join("missing/deeper/../../t.ron"), &table).unwrap());
        assert!(!same_file(&d.join("missing/../missing/t.ron"), &table).unwrap());
        // through a link to a folder; a hard link
        std::os::unix::fs::symlink(d, d.join("here")).unwrap();
        assert!(same_file(&d.join("here/t.ron"), &table).unwrap());
        std::fs::hard_link(&table, d.join("hard.ron")).unwrap();
        assert!(same_file(&d.join("hard.ron"), &table).unwrap());
        assert!(same_file(&d.join("missing/../hard.ron"), &table).unwrap());
        let e = write_atomic_all(&[(&table, b"a"), (&d.join("hard.ron"), b"b")]).unwrap_err();
        assert!(e.to_string().contains("are the same file"), "{e}");
        // an error names the path that caused it
        let e = same_file(&table, &d.join("merged.jsonl/x.ron")).unwrap_err().to_string();
        assert!(e.contains("merged.jsonl/x.ron"), "{e}");
    }
}
