//! The GPU-free half of start-up: which kernels a table needs on a device, the route of every
//! shape, the split-K workspace size, and compiling them.

use super::error::RuntimeError;
use super::workspace::ScratchSizes;
use crate::compile::{CompiledKernel, Compiler, Origin};
use crate::gpu::DeviceInfo;
use crate::problem::{AType, GemmProblem};
use crate::table::{Bucket, Lookup, Method, MismatchPolicy, Table, TableCheck, OP_GEMM};
use crate::template::{family_defaults, Arch, Family, GemmConfig};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// Why a kernel is in the plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlannedKernel {
    pub config: GemmConfig,
    /// Named by a table entry (or a common configuration): failing to compile it is an error.
    /// Family defaults are not required: one that does not compile is dropped with a warning.
    pub required: bool,
}

/// Everything the dispatcher needs that does not touch the GPU.
#[derive(Debug, Clone)]
pub struct Plan {
    pub family: Family,
    pub lookup: Lookup,
    pub check: TableCheck,
    /// Kernels to build, in a stable order (required first).
    pub kernels: Vec<PlannedKernel>,
    /// Per (N, K, A type): (bucket, configuration, method), buckets ascending.
    pub routes: HashMap<(u32, u32, AType), Vec<Bucket>>,
    /// Scratch the routes need for M <= max_m ([`Plan::scratch`]); `composite_elems` 0: no entry
    /// uses the dequantize-then-cuBLAS method, and cuBLAS is not loaded.
    pub scratch: ScratchSizes,
    pub max_m: u32,
    /// Table entries (all ops and families).
    pub entries: usize,
    pub warnings: Vec<String>,
}

/// The kernel family that runs on a device of this compute capability.
pub fn family_for(device: &DeviceInfo) -> Result<Family, RuntimeError> {
    let (major, minor) = device.compute_capability;
    Arch::for_compute_capability(major, minor).map(Family::for_arch).ok_or_else(|| {
        RuntimeError::UnsupportedDevice {
            name: device.name.clone(),
            compute_capability: device.compute_capability,
        }
    })
}

impl Plan {
    /// Plan for `device` from `table` (`None`: no tuned table, family defaults for every shape).
    /// `origin` names the table in messages.
    pub fn new(
        table: Option<&Table>,
        origin: &str,
        device: &DeviceInfo,
        policy: MismatchPolicy,
        max_m: u32,
    ) -> Result<Plan, RuntimeError> {
        let family = family_for(device)?;
        let check = match table {
            Some(t) => t.check_against(device, policy, origin)?,
            None => TableCheck::clean(),
        };
        let lookup = Lookup::new(table, &check);
        let mut warnings: Vec<String> =
            check.warnings().into_iter().map(|w| format!("{origin}: {w}")).collect();
        if table.is_none() {
            warnings.push("no dispatch table: every shape uses the family default".into());
        }
        let mut kernels: BTreeMap<GemmConfig, bool> = BTreeMap::new();
        let mut routes = HashMap::new();
        for a_type in [AType::Nvfp4, AType::Bf16] {
            for ((n, k), buckets) in lookup.shapes(OP_GEMM, family, a_type) {
                for &(_, config, _) in buckets {
                    kernels.insert(config, true);
                }
                routes.insert((n, k, a_type), buckets.to_vec());
            }
            for c in lookup.common(OP_GEMM, family, a_type) {
                kernels.insert(*c, true);
            }
            for d in family_defaults(family, a_type) {
                if d.check().is_ok() {
                    kernels.entry(d).or_insert(false);
                }
            }
        }
        let mut kernels: Vec<PlannedKernel> = kernels
            .into_iter()
            .map(|(config, required)| PlannedKernel { config, required })
            .collect();
        kernels.sort_by_key(|k| !k.required);
        let mut plan = Plan {
            family,
            lookup,
            check,
            kernels,
            routes,
            scratch: ScratchSizes::default(),
            max_m,
            entries: table.map_or(0, |t| t.entries.len()),
            warnings,
        };
        plan.scratch = plan.scratch(max_m);
        Ok(plan)
    }

    /// The scratch every route needs for M <= `max_m`: each bucket takes the M up to it, the
    /// largest bucket of a shape every M up to `max_m`. Entries of the dequantize-then-cuBLAS
    /// method count both ways (they run their fused fallback kernel when cuBLAS cannot be
    /// loaded). Shapes outside the table (common and default configurations) are not planned.
    pub fn scratch(&self, max_m: u32) -> ScratchSizes {
        let mut s = ScratchSizes::default();
        for (&(n, k, a_type), buckets) in &self.routes {
            for (i, &(bucket, config, method)) in buckets.iter().enumerate() {
                let m = if i + 1 == buckets.len() { bucket.max(max_m) } else { bucket };
                let p = GemmProblem::new(m, n, k, a_type);
                s = s.max(ScratchSizes::of_launch(&config, &p, Method::Fused));
                if method == Method::DequantCublasBf16 {
                    s = s.max(ScratchSizes::of_launch(&config, &p, method));
                }
            }
        }
        s
    }

    /// Render and compile every planned kernel (in parallel, through `compiler`'s caches). A
    /// required kernel that fails is an error naming it; a failing default is dropped with a
    /// warning. Returns the kernels that compiled, in plan order, with their configurations.
    pub fn compile(
        &mut self,
        compiler: &Compiler,
    ) -> Result<Vec<(GemmConfig, Arc<CompiledKernel>)>, RuntimeError> {
        let mut sources = Vec::with_capacity(self.kernels.len());
        let mut rendered = Vec::with_capacity(self.kernels.len());
        for k in &self.kernels {
            match k.config.render() {
                Ok(s) => {
                    sources.push(s);
                    rendered.push(*k);
                }
                Err(e) if k.required => {
                    return Err(RuntimeError::Render {
                        config: k.config.name(),
                        reason: e.to_string(),
                    })
                }
                Err(e) => self.warnings.push(format!("default {} dropped: {e}", k.config)),
            }
        }
        let mut out = Vec::with_capacity(sources.len());
        for (k, result) in rendered.into_iter().zip(compiler.compile_many(&sources)) {
            match result {
                Ok(c) => out.push((k.config, c)),
                Err(error) if k.required => {
                    return Err(RuntimeError::Compile { config: k.config.name(), error })
                }
                Err(e) => self.warnings.push(format!("default {} dropped: {e}", k.config)),
            }
        }
        self.kernels.retain(|k| out.iter().any(|(c, _)| *c == k.config));
        Ok(out)
    }
}

/// How many kernels came from where.
pub(crate) fn origins(kernels: &[(GemmConfig, Arc<CompiledKernel>)]) -> (usize, usize, usize) {
    let count = |o: Origin| kernels.iter().filter(|(_, k)| k.origin == o).count();
    (count(Origin::Compiled), count(Origin::DiskCache), count(Origin::MemoryCache))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::template::{default_config, search_space};

    fn h200() -> DeviceInfo {
        crate::table::tests_support::device("NVIDIA H200", (9, 0), 132)
    }

    fn table() -> Table {
        crate::table::tests_support::sample()
    }

    #[test]
    fn plan_routes_every_table_shape_and_loads_every_fallback() {
        let t = table();
        let p = Plan::new(Some(&t), "t.ron", &h200(), MismatchPolicy::Warn, 4096).unwrap();
        assert_eq!(p.family, Family::Sm90);
        assert!(p.warnings.is_empty(), "{:?}", p.warnings);
        let r = &p.routes[&(512, 6144, AType::Bf16)];
        assert_eq!(r.iter().map(|b| b.0).collect::<Vec<_>>(), vec![1, 16, 256]);
        assert_eq!(p.routes.len(), 2);
        for e in &t.entries {
            assert!(p.kernels.iter().any(|k| k.config == e.config && k.required));
        }
        // Every fallback of both A types is planned (the decode and prefill defaults, the generic
        // one and its K-tail form; W4A16's may coincide with a table config).
        for a in [AType::Bf16, AType::Nvfp4] {
            for d in family_defaults(Family::Sm90, a).into_iter().filter(|d| d.check().is_ok()) {
                assert!(p.kernels.iter().any(|k| k.config == d), "default {d} planned");
            }
            assert!(p.kernels.iter().any(|k| k.config == default_config(Family::Sm90, a)));
        }
        assert_eq!(p.entries, 4);
    }

    #[test]
    fn workspace_covers_split_k_routes_up_to_max_m() {
        let mut t = table();
        let p16 = GemmProblem::new(16, 512, 6144, AType::Bf16);
        let c = search_space(Family::Sm90, AType::Bf16)
            .into_iter()
            .find(|c| c.split_k == 4 && c.check_problem(&p16).is_ok())
            .unwrap_or_else(|| GemmConfig {
                split_k: 4,
                ..default_config(Family::Sm90, AType::Bf16)
            });
        assert!(c.check_problem(&p16).is_ok(), "a split-K 4 configuration for M=16: {c}");
        let i = t.entries.iter().position(|e| e.key.n == 512 && e.key.m == 16).unwrap();
        t.entries[i].config = c;
        t.entries[i].runners_up.clear();
        let p = Plan::new(Some(&t), "t", &h200(), MismatchPolicy::Warn, 4096).unwrap();
        // Bucket 16 is not the largest of its shape: M <= 16 is routed to it.
        assert_eq!(p.scratch.split_k_floats, 4 * 16 * 512);
        assert_eq!(
            p.scratch.counter_words,
            (512usize.div_ceil(c.block_n as usize)) * 16usize.div_ceil(c.block_m as usize)
        );
        assert_eq!(p.scratch(64), p.scratch, "a larger max_m does not change a middle bucket");
        // As the largest bucket it takes every M up to max_m.
        t.entries.retain(|e| e.key.n == 512 && e.key.m == 16);
        let p = Plan::new(Some(&t), "t", &h200(), MismatchPolicy::Warn, 4096).unwrap();
        assert_eq!(p.scratch.split_k_floats, 4 * 4096 * 512);
        assert_eq!(p.scratch(100).split_k_floats, 4 * 100 * 512, "a workspace for M <= 100");
        assert_eq!(p.scratch(8).split_k_floats, 4 * 16 * 512, "at least the bucket itself");
        assert_eq!(p.scratch.composite_elems, 0);
    }

    #[test]
    fn composite_entries_size_the_expansion_and_cublas_and_their_fallback_kernel() {
        let mut t = table();
        let i = t.entries.iter().position(|e| e.key.n == 512 && e.key.m == 256).unwrap();
        t.entries[i].method = Method::DequantCublasBf16;
        let fallback = t.entries[i].config;
        let p = Plan::new(Some(&t), "t", &h200(), MismatchPolicy::Warn, 1024).unwrap();
        // (512, 6144) W4A16: W expanded to bf16; bucket 256 is the largest, so up to max_m.
        assert_eq!(p.scratch.composite_elems, 512 * 6144);
        assert_eq!(p.scratch.blas_bytes, super::super::workspace::BLAS_WORKSPACE_BYTES);
        let big = GemmProblem::new(1024, 512, 6144, AType::Bf16);
        assert!(p.scratch.split_k_floats >= fallback.workspace_floats(&big));
        // Without such entries there is no cuBLAS workspace.
        let p = Plan::new(Some(&table()), "t", &h200(), MismatchPolicy::Warn, 1024).unwrap();
        assert_eq!((p.scratch.composite_elems, p.scratch.blas_bytes), (0, 0));
        assert_eq!(
            Plan::new(None, "-", &h200(), MismatchPolicy::Warn, 1024).unwrap().scratch.bytes(),
            0
        );
    }

    #[test]
    fn other_gpu_table_under_warn_plans_defaults_and_under_error_fails() {
        let t = table();
        let blackwell = crate::table::tests_support::device("NVIDIA RTX PRO 6000", (12, 0), 188);
        let p = Plan::new(Some(&t), "h200.ron", &blackwell, MismatchPolicy::Warn, 4096).unwrap();
        assert_eq!(p.family, Family::Sm120);
        assert!(p.routes.is_empty(), "sm90 entries do not route on sm120");
        assert!(
            p.warnings.iter().any(|w| w.contains("h200.ron: table is for compute capability 9.0")),
            "{:?}",
            p.warnings
        );
        let e =
            Plan::new(Some(&t), "h200.ron", &blackwell, MismatchPolicy::Error, 4096).unwrap_err();
        assert!(e.to_string().contains("does not match"), "{e}");
        // A device with no family is refused by name.
        let e = Plan::new(
            Some(&t),
            "t",
            &crate::table::tests_support::device("Tesla V100", (7, 0), 80),
            MismatchPolicy::Warn,
            1,
        )
        .unwrap_err();
        assert!(e.to_string().contains("\"Tesla V100\" has compute capability 7.0"), "{e}");
    }

    #[test]
    fn no_table_plans_only_defaults() {
        let p = Plan::new(None, "-", &h200(), MismatchPolicy::Warn, 4096).unwrap();
        assert!(p.routes.is_empty());
        assert!(p.kernels.iter().all(|k| !k.required));
        assert!(p.warnings[0].contains("no dispatch table"));
    }

    /// Needs NVRTC (CI installs it): a missing cache folder is created, the second start-up finds
    /// every kernel on disk.
    #[test]
    fn compile_creates_a_missing_cache_folder_and_reuses_it() {
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("does/not/exist/yet");
        let mut t = table();
        t.entries.truncate(1);
        let mut p = Plan::new(Some(&t), "t", &h200(), MismatchPolicy::Warn, 4096).unwrap();
        let compiler = Compiler::new(Some(cache.clone())).unwrap_or_else(|e| panic!("{e}"));
        assert!(cache.is_dir(), "the cache folder was created");
        let built = p.compile(&compiler).unwrap();
        assert_eq!(built.len(), p.kernels.len());
        let (compiled, disk, _) = origins(&built);
        assert_eq!((compiled, disk), (built.len(), 0));
        let mut p2 = Plan::new(Some(&t), "t", &h200(), MismatchPolicy::Warn, 4096).unwrap();
        let again = p2.compile(&Compiler::new(Some(cache)).unwrap()).unwrap();
        assert_eq!(origins(&again), (0, built.len(), 0));
        // An uncreatable cache folder is an error naming it.
        let file = dir.path().join("a_file");
        std::fs::write(&file, b"x").unwrap();
        let e = Compiler::new(Some(file.join("sub"))).unwrap_err().to_string();
        assert!(e.contains("a_file"), "{e}");
    }
}
