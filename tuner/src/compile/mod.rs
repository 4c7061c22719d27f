//! The compile pipeline: rendered kernel source -> NVRTC -> CUBIN + ptxas statistics, cached.
//!
//! An in-memory map sits in front of the on-disk cache; both are keyed by a hash of (source,
//! options, arch, NVRTC build). Compilation of many kernels runs in parallel with rayon. A
//! failure keeps the kernel name (which encodes its configuration), the options and the NVRTC log.

pub mod cache;
pub mod sass;
pub mod stats;

use crate::gpu::nvrtc::{self, NvrtcError};
use crate::template::{Arch, KernelSource};
use cache::{CacheMeta, DiskCache, CACHE_SCHEMA_VERSION};
use rayon::prelude::*;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

pub use stats::PtxasStats;

/// Why a kernel did not compile.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CompileError {
    #[error(transparent)]
    Nvrtc(#[from] NvrtcError),
    #[error("the cubin cache at {dir}: {message}")]
    Cache { dir: String, message: String },
}

/// A compiled kernel, ready to be loaded into a CUDA module.
#[derive(Debug, Clone)]
pub struct CompiledKernel {
    pub kernel_name: String,
    pub arch: Arch,
    pub cubin: Vec<u8>,
    /// ptxas statistics of the kernel (`None` if the log held none).
    pub stats: Option<PtxasStats>,
    pub log: String,
    /// Wall time NVRTC took when this entry was first built.
    pub compile_ms: f64,
    /// Where this result came from in this call.
    pub origin: Origin,
    /// Cache key (hex).
    pub key: String,
}

impl CompiledKernel {
    /// Whether ptxas reported spill stores or loads for the kernel.
    pub fn spills(&self) -> bool {
        self.stats.as_ref().is_some_and(|s| s.spills())
    }
}

impl crate::gpu::KernelImage for CompiledKernel {
    fn kernel_name(&self) -> &str {
        &self.kernel_name
    }
    fn cubin(&self) -> &[u8] {
        &self.cubin
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    Compiled,
    DiskCache,
    MemoryCache,
}

/// What [`Compiler::precompile`] found and did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Precompiled {
    /// Kernels already in the on-disk cache.
    pub cached: usize,
    /// Kernels compiled and stored.
    pub compiled: usize,
}

impl std::ops::AddAssign for Precompiled {
    fn add_assign(&mut self, o: Self) {
        self.cached += o.cached;
        self.compiled += o.compiled;
    }
}

/// NVRTC plus its caches. Cheap to share across threads.
#[derive(Debug)]
pub struct Compiler {
    nvrtc: nvrtc::NvrtcBuild,
    disk: Option<DiskCache>,
    memory: Mutex<HashMap<String, Arc<CompiledKernel>>>,
}

impl Compiler {
    /// Locate NVRTC; cache on disk in `disk_dir` (or no disk cache with `None`).
    pub fn new(disk_dir: Option<std::path::PathBuf>) -> Result<Self, CompileError> {
        let nvrtc = nvrtc::build()?;
        let disk = match disk_dir {
            Some(d) => Some(DiskCache::new(&d).map_err(|e| CompileError::Cache {
                dir: d.display().to_string(),
                message: e.to_string(),
            })?),
            None => None,
        };
        Ok(Self { nvrtc, disk, memory: Mutex::new(HashMap::new()) })
    }

    /// A compiler with the default on-disk cache folder ([`DiskCache::default_dir`]).
    pub fn with_default_cache() -> Result<Self, CompileError> {
        Self::new(Some(DiskCache::default_dir()))
    }

    pub fn nvrtc_version(&self) -> (i32, i32) {
        self.nvrtc.version
    }

    /// The NVRTC build that compiles (its release and compiler build where NVRTC says them).
    pub fn nvrtc_build(&self) -> &nvrtc::NvrtcBuild {
        &self.nvrtc
    }

    pub fn cache_dir(&self) -> Option<&std::path::Path> {
        self.disk.as_ref().map(|d| d.dir())
    }

    /// Why the on-disk cache folder is not used (group- or world-writable, owned by someone
    /// else, not a folder), in which case kernels are compiled in memory, or why new kernels are
    /// not stored in it (not writable, a store that failed); for the caller to print once (a
    /// store can fail later: ask again at the end). `None` when the folder is read and written or
    /// there is no disk cache.
    pub fn cache_warning(&self) -> Option<&str> {
        self.disk.as_ref().and_then(|d| d.warning())
    }

    /// Whether kernels are read from the on-disk cache folder (there is one and it is trusted,
    /// writable or not).
    pub fn cache_readable(&self) -> bool {
        self.disk.as_ref().is_some_and(|d| d.readable())
    }

    /// Cache key of `src` under this compiler: the source's hash and the NVRTC build (two builds
    /// of one minor version never share a cubin).
    pub fn key(&self, src: &KernelSource) -> String {
        let mut h = Sha256::new();
        h.update(src.hash().as_bytes());
        h.update(format!("nvrtc {}", self.nvrtc).as_bytes());
        crate::template::source::hex(&h.finalize())[..32].to_string()
    }

    /// Compile one kernel, or fetch it from a cache.
    pub fn compile(&self, src: &KernelSource) -> Result<Arc<CompiledKernel>, CompileError> {
        let key = self.key(src);
        if let Some(hit) = self.memory.lock().unwrap_or_else(|p| p.into_inner()).get(&key) {
            let mut k = (**hit).clone();
            k.origin = Origin::MemoryCache;
            return Ok(Arc::new(k));
        }
        let kernel = match self.disk.as_ref().and_then(|d| d.get(&key)) {
            Some((meta, cubin)) if meta.kernel_name == src.kernel_name => CompiledKernel {
                kernel_name: meta.kernel_name,
                arch: src.arch,
                cubin,
                stats: meta.stats,
                log: meta.log,
                compile_ms: meta.compile_ms,
                origin: Origin::DiskCache,
                key: key.clone(),
            },
            _ => {
                let t0 = Instant::now();
                let out = nvrtc::compile_cubin(&src.kernel_name, &src.code, &src.options)?;
                let compile_ms = t0.elapsed().as_secs_f64() * 1e3;
                let stats = stats::parse(&out.log, &src.kernel_name);
                if let Some(d) = &self.disk {
                    let meta = CacheMeta {
                        schema_version: CACHE_SCHEMA_VERSION,
                        kernel_name: src.kernel_name.clone(),
                        arch: src.arch.as_str().to_string(),
                        nvrtc_version: self.nvrtc.version,
                        stats,
                        compile_ms,
                        log: out.log.clone(),
                    };
                    // A store that fails leaves the kernel compiled; the cache's warning says why.
                    d.put(&key, &meta, &out.cubin);
                }
                CompiledKernel {
                    kernel_name: src.kernel_name.clone(),
                    arch: src.arch,
                    cubin: out.cubin,
                    stats,
                    log: out.log,
                    compile_ms,
                    origin: Origin::Compiled,
                    key: key.clone(),
                }
            }
        };
        let kernel = Arc::new(kernel);
        self.memory.lock().unwrap_or_else(|p| p.into_inner()).insert(key, kernel.clone());
        Ok(kernel)
    }

    /// How many of `sources` the on-disk cache holds (0 without a usable disk cache).
    pub fn count_cached(&self, sources: &[KernelSource]) -> usize {
        let Some(disk) = self.disk.as_ref().filter(|d| d.readable()) else {
            return 0;
        };
        sources.par_iter().filter(|s| disk.contains(&self.key(s))).count()
    }

    /// Fill the on-disk cache with `sources` in parallel, without keeping the kernels in memory
    /// (for other processes, e.g. the tuner's measuring worker, to load): returns how many were
    /// already stored and how many were compiled now (failures are left for the caller that
    /// compiles them for real to report). Without a usable disk cache nothing is done.
    pub fn precompile(&self, sources: &[KernelSource]) -> Precompiled {
        self.precompile_until(sources, &AtomicBool::new(false))
    }

    /// [`Compiler::precompile`] that compiles nothing more once `stop` is set (kernels being
    /// compiled then finish): a background compile that its campaign's end stops soon.
    pub fn precompile_until(&self, sources: &[KernelSource], stop: &AtomicBool) -> Precompiled {
        let Some(disk) = self.disk.as_ref().filter(|d| d.writable()) else {
            return Precompiled::default();
        };
        let keys: Vec<String> = sources.par_iter().map(|s| self.key(s)).collect();
        // each key once (sources that are one kernel, e.g. walk variants, are one entry)
        let mut seen = std::collections::HashSet::new();
        let distinct: Vec<(&KernelSource, &String)> =
            sources.iter().zip(&keys).filter(|(_, k)| seen.insert(k.as_str())).collect();
        let cached: Vec<bool> = distinct.par_iter().map(|(_, k)| disk.contains(k)).collect();
        let todo: Vec<(&KernelSource, &String)> =
            distinct.iter().zip(&cached).filter(|(_, c)| !**c).map(|(sk, _)| *sk).collect();
        let compiled = todo
            .par_iter()
            .filter(|(s, key)| {
                // Another process may have stored it meanwhile.
                if stop.load(Ordering::Relaxed) || !disk.writable() || disk.contains(key) {
                    return false;
                }
                let t0 = Instant::now();
                let Ok(out) = nvrtc::compile_cubin(&s.kernel_name, &s.code, &s.options) else {
                    return false;
                };
                let meta = CacheMeta {
                    schema_version: CACHE_SCHEMA_VERSION,
                    kernel_name: s.kernel_name.clone(),
                    arch: s.arch.as_str().to_string(),
                    nvrtc_version: self.nvrtc.version,
                    stats: stats::parse(&out.log, &s.kernel_name),
                    compile_ms: t0.elapsed().as_secs_f64() * 1e3,
                    log: out.log,
                };
                disk.put(key, &meta, &out.cubin)
            })
            .count();
        Precompiled { cached: cached.iter().filter(|c| **c).count(), compiled }
    }

    /// Compile many kernels in parallel; results come back in input order, each on its own.
    /// Sources that are one kernel (one cache key, e.g. walk variants of a grouped kernel)
    /// compile once and share the result.
    pub fn compile_many(
        &self,
        sources: &[KernelSource],
    ) -> Vec<Result<Arc<CompiledKernel>, CompileError>> {
        let keys: Vec<String> = sources.par_iter().map(|s| self.key(s)).collect();
        let mut slot_of: HashMap<&str, usize> = HashMap::new();
        let mut distinct: Vec<usize> = Vec::new();
        for (i, k) in keys.iter().enumerate() {
            slot_of.entry(k.as_str()).or_insert_with(|| {
                distinct.push(i);
                distinct.len() - 1
            });
        }
        let results: Vec<_> = distinct.par_iter().map(|&i| self.compile(&sources[i])).collect();
        keys.iter().map(|k| results[slot_of[k.as_str()]].clone()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// NVRTC is a hard requirement of the test suite: CI installs the wheel (see .ci/run). A
    /// missing NVRTC fails these tests with the loader's message rather than skipping them.
    fn compiler(dir: &std::path::Path) -> Compiler {
        Compiler::new(Some(dir.to_path_buf())).unwrap_or_else(|e| panic!("{e}"))
    }

    fn probe(arch: Arch, body: &str) -> KernelSource {
        let unit = format!(
            "#include \"common/params.cuh\"\nextern \"C\" __global__ void probe_kernel(const fp4tune::GemmParams p) {{ {body} }}\n"
        );
        KernelSource::from_unit("probe_kernel".into(), arch, &unit).unwrap()
    }

    /// Sources that are one kernel (one key) compile once in a batch and share the result.
    #[test]
    fn one_kernel_twice_in_a_batch_compiles_once() {
        let dir = tempfile::tempdir().unwrap();
        let c = compiler(dir.path());
        let a = probe(Arch::Sm90a, "if (p.m < 0) p.y[0] = 1;");
        let b = probe(Arch::Sm90a, "if (p.m < 0) p.y[0] = 2;");
        let out = c.compile_many(&[a.clone(), b, a]);
        let (first, last) = (out[0].as_ref().unwrap(), out[2].as_ref().unwrap());
        assert!(Arc::ptr_eq(first, last), "the same compiled kernel");
        assert!(!Arc::ptr_eq(first, out[1].as_ref().unwrap()));
        assert_eq!(first.origin, Origin::Compiled);
    }

    /// A cache folder others can write is not used, and the compiler says
    /// why (the CLI and the dispatcher's start-up report print it).
    #[cfg(unix)]
    #[test]
    fn a_shared_cache_folder_is_the_compilers_warning() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(compiler(dir.path()).cache_warning(), None);
        assert_eq!(Compiler::new(None).unwrap_or_else(|e| panic!("{e}")).cache_warning(), None);
        let shared = dir.path().join("shared");
        std::fs::create_dir(&shared).unwrap();
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o777)).unwrap();
        let c = compiler(&shared);
        let w = c.cache_warning().expect("a warning for a world-writable folder");
        assert!(w.contains("world-writable") && w.contains(&*shared.to_string_lossy()), "{w}");
        // Compiled in memory: nothing lands in the folder.
        let k = c.compile(&probe(Arch::Sm90a, "")).unwrap();
        assert_eq!(k.origin, Origin::Compiled);
        assert_eq!(std::fs::read_dir(&shared).unwrap().count(), 0);
    }

    #[test]
    fn compiles_for_both_archs_with_stats_and_caches() {
        let dir = tempfile::tempdir().unwrap();
        let c = compiler(dir.path());
        for arch in [Arch::Sm90a, Arch::Sm120a] {
            let src =
                probe(arch, "if (p.y) p.y[threadIdx.x] = fp4tune::float_to_bf16_bits(p.alpha);");
            let k = c.compile(&src).unwrap();
            assert_eq!(k.origin, Origin::Compiled);
            assert_eq!(&k.cubin[..4], b"\x7fELF");
            let s = k.stats.expect("ptxas -v statistics in the log");
            assert!(s.registers > 0 && !s.spills(), "{s:?}");
            assert_eq!(c.compile(&src).unwrap().origin, Origin::MemoryCache);
            // A fresh compiler on the same folder finds it on disk.
            let c2 = compiler(dir.path());
            let again = c2.compile(&src).unwrap();
            assert_eq!(again.origin, Origin::DiskCache);
            assert_eq!(again.cubin, k.cubin);
            assert_eq!(again.stats, k.stats);
        }
    }

    #[test]
    fn errors_keep_name_options_and_log() {
        let dir = tempfile::tempdir().unwrap();
        let c = compiler(dir.path());
        let src = probe(Arch::Sm90a, "this is not C++;");
        let err = c.compile(&src).unwrap_err().to_string();
        assert!(err.contains("probe_kernel"), "{err}");
        assert!(err.contains("--gpu-architecture=sm_90a"), "{err}");
        assert!(err.contains("error"), "{err}");
        // Failures are not cached: nothing was written.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn sass_of_a_compiled_kernel_can_be_read() {
        let dir = tempfile::tempdir().unwrap();
        let c = compiler(dir.path());
        let k = c.compile(&probe(Arch::Sm120a, "if (p.y) p.y[threadIdx.x] = 7;")).unwrap();
        let sass = sass::dump_sass(&k.kernel_name, &k.cubin).unwrap_or_else(|e| panic!("{e}"));
        assert!(sass.contains("sm_120a"), "{sass}");
        assert!(sass::count_opcode(&sass, "STG") >= 1, "{sass}");
        assert!(!sass::uses_local_memory(&sass));
    }

    #[test]
    fn compile_many_keeps_order_and_isolates_failures() {
        let dir = tempfile::tempdir().unwrap();
        let c = compiler(dir.path());
        let srcs = vec![
            probe(Arch::Sm90a, ""),
            probe(Arch::Sm90a, "syntax error here"),
            probe(Arch::Sm120a, "if (p.y) p.y[0] = 1;"),
        ];
        let r = c.compile_many(&srcs);
        assert!(r[0].is_ok() && r[1].is_err() && r[2].is_ok());
        assert_eq!(r[2].as_ref().unwrap().arch, Arch::Sm120a);
    }
}
