//! The dispatcher: kernels loaded at open, routes by shape, launches on the caller's stream.

use super::composite::{DequantGemm, Operands};
use super::error::RuntimeError;
use super::plan::{origins, Plan};
use super::route::{MoeLayerRoute, MoeRouteTable, Route, RouteKind};
use super::workspace::{check_capacity, GemmWorkspace, ScratchSizes};
use crate::compile::cache::DiskCache;
use crate::compile::Compiler;
use crate::gpu::raw::RawStream;
use crate::gpu::{DeviceInfo, GemmParams, Gpu, Kernel};
use crate::moe::order::WeightOrder;
use crate::moe::MoeShape;
use crate::problem::{AType, GemmProblem};
use crate::table::{Fallback, Method, MismatchPolicy, Table, OP_GEMM};
use crate::template::{Family, GemmConfig};
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

/// Source of [`Dispatcher`] identities (a workspace names the dispatcher that sized it).
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// How to open a dispatcher.
#[derive(Debug, Clone)]
pub struct Options {
    /// CUDA device ordinal.
    pub device: usize,
    /// CUBIN cache folder; `None`: [`DiskCache::default_dir`] (`$FP4TUNE_CACHE`, else
    /// `~/.cache/fp4tune/cubin`). Created when missing.
    pub cache_dir: Option<PathBuf>,
    /// What a table made on another device or with other template sources does.
    pub policy: MismatchPolicy,
    /// Largest M the dispatcher's own workspace is sized for at open (larger M grows it on first
    /// use through [`Dispatcher::gemm`]); also the size [`Dispatcher::gemm_workspace`] takes for
    /// its `max_m` in the C ABI when given 0.
    pub max_m: u32,
}

impl Default for Options {
    fn default() -> Self {
        Self { device: 0, cache_dir: None, policy: MismatchPolicy::Warn, max_m: 8192 }
    }
}

/// One GEMM's device operands (raw device addresses of the caller's buffers, in the layout of
/// ARCHITECTURE.md "Data layout") and sizes: Y[M, N] = alpha * A[M, K] * W[N, K]^T.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GemmArgs {
    pub a: u64,
    /// W4A4: A's swizzled scales; W4A16: unused (may be 0).
    pub a_sf: u64,
    pub w: u64,
    pub w_sf: u64,
    pub y: u64,
    pub m: u32,
    pub n: u32,
    pub k: u32,
    pub a_type: AType,
    pub alpha: f32,
}

/// What start-up did and how long it took.
#[derive(Debug, Clone)]
pub struct StartupReport {
    pub device: String,
    pub family: Family,
    /// The table's path, or `None` when opened without a table.
    pub table: Option<PathBuf>,
    pub entries: usize,
    /// Shapes (N, K, A type) with routes.
    pub shapes: usize,
    pub kernels: usize,
    pub compiled: usize,
    pub from_disk_cache: usize,
    pub from_memory_cache: usize,
    pub cache_dir: Option<PathBuf>,
    pub compile_s: f64,
    pub load_s: f64,
    pub total_s: f64,
    /// The M the workspaces are sized for ([`Options::max_m`]).
    pub max_m: u32,
    /// Bytes of one workspace for M <= `max_m` (the dispatcher's own, or one stream's).
    pub workspace_bytes: usize,
    /// Of those, the bytes of the dequantize-then-cuBLAS method (bf16 expansion and cuBLAS
    /// workspace; 0 when no entry uses it).
    pub composite_bytes: usize,
    /// One line per grouped MoE layer of the table: its buckets per op and kernels.
    pub moe_layers: Vec<String>,
    pub warnings: Vec<String>,
}

impl fmt::Display for StartupReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let table = self.table.as_ref().map_or("none".to_string(), |p| p.display().to_string());
        writeln!(
            f,
            "fp4tune dispatcher on {} ({}): table {table}, {} entries, {} shapes",
            self.device, self.family, self.entries, self.shapes
        )?;
        writeln!(
            f,
            "  {} kernels: {} compiled, {} from the disk cache, {} from memory ({})",
            self.kernels,
            self.compiled,
            self.from_disk_cache,
            self.from_memory_cache,
            self.cache_dir
                .as_ref()
                .map_or("no disk cache".to_string(), |d| d.display().to_string())
        )?;
        write!(
            f,
            "  start-up {:.3} s (compile {:.3} s, load {:.3} s), workspace {} bytes per stream for M <= {}",
            self.total_s, self.compile_s, self.load_s, self.workspace_bytes, self.max_m
        )?;
        if self.composite_bytes > 0 {
            write!(
                f,
                "\n  dequantize-then-cuBLAS entries: cuBLAS loaded, {} bytes of the workspace",
                self.composite_bytes
            )?;
        }
        for l in &self.moe_layers {
            write!(f, "\n  {l}")?;
        }
        for w in &self.warnings {
            write!(f, "\n  warning: {w}")?;
        }
        Ok(())
    }
}

/// (N, K, A type).
type Shape = (u32, u32, AType);

#[derive(Debug)]
struct Loaded {
    config: GemmConfig,
    kernel: Kernel,
}

/// An open device with every kernel of a dispatch table loaded. `Send + Sync`: share one per
/// device across serving threads.
#[derive(Debug)]
pub struct Dispatcher {
    /// Unique in the process: the owner recorded in the workspaces it creates.
    id: u64,
    gpu: Gpu,
    plan: Plan,
    kernels: Vec<Loaded>,
    by_config: HashMap<GemmConfig, usize>,
    /// Per (N, K, A type): (bucket, kernel index, method), buckets ascending.
    routes: HashMap<Shape, Vec<(u32, usize, Method)>>,
    /// The workspace of [`Dispatcher::gemm`] (launches without a workspace of their own).
    workspace: Mutex<GemmWorkspace>,
    /// The composite path, loaded when an entry chose it (else its entries run their fallback).
    composite: Option<DequantGemm>,
    /// First warning of each shape and configuration it fell back to, and how many launches
    /// took it (a shape outside the table takes a decode default up to M = 64, another above).
    fallbacks: Mutex<BTreeMap<(Shape, GemmConfig), (String, u64)>>,
    /// The grouped MoE layers: loaded at open when the table has grouped entries of this
    /// device's family, else at the first use of [`Dispatcher::moe`] (the family defaults only).
    moe: std::sync::OnceLock<super::moe::MoeRuntime>,
    /// Held while [`Dispatcher::moe`] loads the grouped layers after open (a failed load is
    /// not kept: the next call tries again and returns its own error).
    moe_init: Mutex<()>,
    /// The compiler of the open, for the grouped kernels loaded after it.
    compiler: std::sync::Arc<Compiler>,
    /// The grouped routes (GPU-free): the table's entries of this device's family, the family
    /// defaults of every other layer.
    moe_routes: MoeRouteTable,
    report: StartupReport,
}

impl Dispatcher {
    /// Open device `options.device`, load and check the table at `table_path`, build every
    /// kernel it names (or take it from the CUBIN cache) and load it.
    pub fn open(table_path: impl AsRef<Path>, options: &Options) -> Result<Self, RuntimeError> {
        let path = table_path.as_ref();
        let table = Table::load(path)?;
        Self::open_with(Some((&table, path)), options)
    }

    /// Open without a tuned table: every shape uses its family default.
    pub fn open_untuned(options: &Options) -> Result<Self, RuntimeError> {
        Self::open_with(None, options)
    }

    /// Open with an in-memory table (`origin` names it in messages).
    pub fn open_with(
        table: Option<(&Table, &Path)>,
        options: &Options,
    ) -> Result<Self, RuntimeError> {
        let t0 = Instant::now();
        let gpu = Gpu::open(options.device)?;
        let origin = table.map_or("-".to_string(), |(_, p)| p.display().to_string());
        let mut plan =
            Plan::new(table.map(|(t, _)| t), &origin, gpu.info(), options.policy, options.max_m)?;
        let cache_dir = options.cache_dir.clone().unwrap_or_else(DiskCache::default_dir);
        let compiler = Compiler::new(Some(cache_dir.clone())).map_err(|error| {
            RuntimeError::Compiler { cache_dir: Some(cache_dir.clone()), error }
        })?;
        // kept: the grouped layers outside the table are built after open
        let compiler = std::sync::Arc::new(compiler);
        let t_compile = Instant::now();
        let built = plan.compile(&compiler)?;
        let compile_s = t_compile.elapsed().as_secs_f64();
        let t_load = Instant::now();
        let mut kernels = Vec::with_capacity(built.len());
        let mut by_config = HashMap::with_capacity(built.len());
        for (config, compiled) in &built {
            let kernel = gpu.load(compiled, config.smem_bytes())?;
            by_config.insert(*config, kernels.len());
            kernels.push(Loaded { config: *config, kernel });
        }
        // The composite path only when an entry chose it; without cuBLAS those entries run their
        // fallback kernel, said once in the start-up report.
        let composite = if plan.scratch.composite_elems > 0 {
            match DequantGemm::new(&gpu, &compiler) {
                Ok(d) => Some(d),
                Err(e) => {
                    plan.warnings.push(format!(
                        "dequantize-then-cuBLAS entries run their fallback fused kernels: {e}"
                    ));
                    None
                }
            }
        } else {
            None
        };
        let mut routes = HashMap::with_capacity(plan.routes.len());
        for (shape, buckets) in &plan.routes {
            let mut r = Vec::with_capacity(buckets.len());
            for (bucket, config, method) in buckets {
                let idx =
                    *by_config.get(config).ok_or_else(|| RuntimeError::NotLoaded(config.name()))?;
                let method = if composite.is_some() { *method } else { Method::Fused };
                r.push((*bucket, idx, method));
            }
            routes.insert(*shape, r);
        }
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        let scratch = scratch_with(&plan, options.max_m, composite.is_some());
        let workspace = GemmWorkspace::new(&gpu, id, options.max_m, scratch)?;
        let moe = std::sync::OnceLock::new();
        let own = super::route::own_grouped(table.map(|(t, _)| t), plan.family);
        if let Some(t) = own {
            let c = compiler.clone();
            let _ = moe.set(super::moe::MoeRuntime::load(&gpu, c, Some(t), &mut plan.warnings)?);
        } else if table.is_some_and(|(t, _)| !t.moe.is_empty()) {
            plan.warnings.push(format!(
                "the table's grouped MoE entries are not for the {} family of {}: every grouped \
                 layer runs the family defaults",
                plan.family,
                gpu.info().name
            ));
        }
        let moe_routes =
            MoeRouteTable::with_defaults(table.map(|(t, _)| t), plan.family, gpu.info().sm_count);
        // after every compile of the open: a store can fail on the way
        plan.warnings.extend(compiler.cache_warning().map(str::to_string));
        gpu.synchronize()?;
        let load_s = t_load.elapsed().as_secs_f64();
        let (compiled, from_disk_cache, from_memory_cache) = origins(&built);
        let report = StartupReport {
            device: gpu.info().name.clone(),
            family: plan.family,
            table: table.map(|(_, p)| p.to_path_buf()),
            entries: plan.entries,
            shapes: routes.len(),
            kernels: kernels.len(),
            compiled,
            from_disk_cache,
            from_memory_cache,
            cache_dir: Some(cache_dir),
            compile_s,
            load_s,
            total_s: t0.elapsed().as_secs_f64(),
            max_m: options.max_m,
            workspace_bytes: workspace.bytes(),
            composite_bytes: scratch.bytes()
                - ScratchSizes { composite_elems: 0, blas_bytes: 0, ..scratch }.bytes(),
            moe_layers: moe_routes.summary(),
            warnings: plan.warnings.clone(),
        };
        Ok(Self {
            id,
            gpu,
            plan,
            kernels,
            by_config,
            routes,
            workspace: Mutex::new(workspace),
            composite,
            fallbacks: Mutex::new(BTreeMap::new()),
            moe,
            moe_init: Mutex::new(()),
            compiler,
            moe_routes,
            report,
        })
    }

    /// The grouped MoE operations: the table's layers as tuned, every other layer on the family
    /// defaults (`moe::defaults`), loaded by its first workspace. Without grouped entries in the
    /// table, the first call loads the fixed kernels (align, finalize, weight order); an error
    /// saying why when they cannot load (no NVRTC, a compile error).
    pub fn moe(&self) -> Result<super::moe::MoeOps<'_>, RuntimeError> {
        let ops = |runtime| super::moe::MoeOps { gpu: &self.gpu, runtime, owner: self.id };
        if let Some(runtime) = self.moe.get() {
            return Ok(ops(runtime));
        }
        let _init = self.moe_init.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(runtime) = self.moe.get() {
            return Ok(ops(runtime));
        }
        let compiler = self.compiler.clone();
        let runtime = super::moe::MoeRuntime::load(&self.gpu, compiler, None, &mut Vec::new())?;
        Ok(ops(self.moe.get_or_init(|| runtime)))
    }

    /// The grouped kernels the layer `shape` of a model of `experts_total` routed experts
    /// (`MoeOps::workspace`) with activations `a_type` launches for `tokens` (gate_up and down),
    /// the token bucket each fell into and why (the table's entries, or the family defaults of a
    /// layer the table has none for), no launch and no compile. An error saying why when the
    /// layer has no grouped route (the grouped launches are refused then too), or when its
    /// defaults were loaded for another `experts_total` (a route asked before the layer's first
    /// workspace is the one a workspace naming the same `experts_total` would load).
    pub fn moe_route(
        &self,
        shape: &MoeShape,
        experts_total: u32,
        a_type: AType,
        tokens: u32,
    ) -> Result<MoeLayerRoute, RuntimeError> {
        if let Some(runtime) = self.moe.get() {
            runtime.loaded(shape, experts_total)?;
        }
        self.moe_routes.route(shape, experts_total, a_type, tokens)
    }

    /// Every (layer shape, activation type) the table has grouped routes for (any other layer
    /// runs the family defaults).
    pub fn moe_layers(&self) -> Vec<(MoeShape, AType)> {
        self.moe_routes.layers()
    }

    pub fn report(&self) -> &StartupReport {
        &self.report
    }

    pub fn device(&self) -> &DeviceInfo {
        self.gpu.info()
    }

    /// Current size of the dispatcher's own workspace (the one [`Dispatcher::gemm`] uses), in
    /// bytes.
    pub fn workspace_bytes(&self) -> usize {
        self.workspace.lock().unwrap_or_else(|p| p.into_inner()).bytes()
    }

    /// The scratch every route of the table needs for M <= `max_m` on this device (the
    /// dequantize-then-cuBLAS parts only when cuBLAS was loaded).
    pub fn scratch_sizes(&self, max_m: u32) -> ScratchSizes {
        scratch_with(&self.plan, max_m, self.composite.is_some())
    }

    /// A workspace for one stream's launches through [`Dispatcher::gemm_in`], sized for every
    /// route of the table up to `max_m` ([`Dispatcher::scratch_sizes`]): create one per stream
    /// that launches at the same time as others (two micro-batches on two streams), before any
    /// capture. Allocates and waits for the allocation; the launches then allocate nothing.
    pub fn gemm_workspace(&self, max_m: u32) -> Result<GemmWorkspace, RuntimeError> {
        if max_m == 0 {
            return Err(RuntimeError::InvalidArgument("a GEMM workspace needs max_m >= 1".into()));
        }
        GemmWorkspace::new(&self.gpu, self.id, max_m, self.scratch_sizes(max_m))
    }

    pub fn family(&self) -> Family {
        self.plan.family
    }

    /// Every shape that fell back to a common or default configuration so far: one warning each,
    /// with the number of launches that took it.
    pub fn fallbacks(&self) -> Vec<String> {
        let f = self.fallbacks.lock().unwrap_or_else(|p| p.into_inner());
        f.values().map(|(w, n)| format!("{w} ({n} launches)")).collect()
    }

    /// The configuration a GEMM of this shape launches, and why (no launch).
    pub fn route(&self, m: u32, n: u32, k: u32, a_type: AType) -> Result<Route, RuntimeError> {
        self.route_index(&GemmProblem::new(m, n, k, a_type)).map(|(i, kind, method)| Route {
            config: self.kernels[i].config,
            method,
            kind,
        })
    }

    fn route_index(&self, p: &GemmProblem) -> Result<(usize, RouteKind, Method), RuntimeError> {
        if let Some(buckets) = self.routes.get(&(p.n, p.k, p.a_type)) {
            let i = buckets.partition_point(|(m, _, _)| *m < p.m).min(buckets.len() - 1);
            let (bucket, idx, method) = buckets[i];
            if self.kernels[idx].config.check_problem(p).is_ok() {
                let kind = if bucket == p.m {
                    RouteKind::Exact
                } else {
                    RouteKind::NearestBucket { bucket }
                };
                return Ok((idx, kind, method));
            }
        }
        self.route_slow(p)
    }

    /// Shapes without a usable route: the table's lookup with its fallback order, recorded.
    #[cold]
    fn route_slow(&self, p: &GemmProblem) -> Result<(usize, RouteKind, Method), RuntimeError> {
        // a family default that did not build at open (dropped with a warning) gives way to the next
        let loaded = |c: &GemmConfig| self.by_config.contains_key(c);
        let resolved =
            self.plan.lookup.resolve_among(OP_GEMM, self.plan.family, p, None, loaded)?;
        let idx = *self
            .by_config
            .get(&resolved.config)
            .ok_or_else(|| RuntimeError::NotLoaded(resolved.config.name()))?;
        let kind = match resolved.fallback {
            Fallback::Exact => RouteKind::Exact,
            Fallback::NearestBucket { bucket } => RouteKind::NearestBucket { bucket },
            Fallback::Common { .. } => RouteKind::Common,
            Fallback::Default { .. } => RouteKind::Default,
        };
        if let Some(w) = resolved.warning(OP_GEMM, p) {
            let mut f = self.fallbacks.lock().unwrap_or_else(|e| e.into_inner());
            f.entry(((p.n, p.k, p.a_type), resolved.config)).or_insert((w, 0)).1 += 1;
        }
        let method = if self.composite.is_some() { resolved.method } else { Method::Fused };
        Ok((idx, kind, method))
    }

    /// Launch Y = alpha * A * W^T with the table's kernel for this shape on `stream`, with the
    /// dispatcher's own workspace for split-K kernels and dequantize-then-cuBLAS entries.
    ///
    /// That workspace serves one stream: use this on a single stream (the default stream, say).
    /// Streams whose launches may run at the same time each pass a workspace of their own to
    /// [`Dispatcher::gemm_in`]. A launch that needs more than the workspace holds (M above
    /// `Options::max_m` on such a route) grows it outside the hot path: it waits for the whole
    /// device, so it is refused while `stream` is being captured into a CUDA graph.
    ///
    /// # Safety
    /// The pointers must be device addresses in this device's primary context of buffers holding
    /// at least the data layout's sizes for (m, n, k) (W codes `n*k/2` bytes, W scales the
    /// swizzled size with rows padded to 128, A `m*k*2` bytes (W4A16) or `m*k/2` + swizzled scales
    /// (W4A4), Y `m*n*2` bytes), alive until the launch completes; `stream` must be 0 or a live
    /// stream of that context. Launches through this function that use the workspace (split-K
    /// kernels, dequantize-then-cuBLAS entries) must not overlap on the GPU: they come from one
    /// stream, or the caller orders them.
    pub unsafe fn gemm(&self, args: &GemmArgs, stream: RawStream) -> Result<Route, RuntimeError> {
        validate(args)?;
        self.refuse_prepared_codes(args)?;
        let p = GemmProblem::new(args.m, args.n, args.k, args.a_type);
        let (idx, kind, method) = self.route_index(&p)?;
        let need = ScratchSizes::of_launch(&self.kernels[idx].config, &p, method);
        if need.is_empty() {
            // SAFETY: the caller's buffer and stream contract; the launch uses no scratch.
            return unsafe { self.launch(idx, kind, method, args, &p, None, stream) };
        }
        let mut ws = self.workspace.lock().unwrap_or_else(|e| e.into_inner());
        if !ws.capacity().covers(&need) {
            // SAFETY: stream validity is the caller's contract.
            unsafe { self.grow(&mut ws, &need, p.m, stream)? };
        }
        // SAFETY: the caller's buffer and stream contract; the workspace is held under the lock
        // and used by no other stream's launch (this function's contract).
        unsafe { self.launch(idx, kind, method, args, &p, Some(&ws), stream) }
    }

    /// Refuse W codes that lie in weights prepared for the grouped kernels where that put them in
    /// another order than the ModelOpt one the GEMM kernels read (sm90; on sm120 the grouped
    /// kernels read the ModelOpt order and preparing leaves the codes as they are).
    fn refuse_prepared_codes(&self, args: &GemmArgs) -> Result<(), RuntimeError> {
        // not loaded: nothing was prepared
        let Some(moe) = self.moe.get() else { return Ok(()) };
        if WeightOrder::of(self.family()) == WeightOrder::ModelOpt {
            return Ok(());
        }
        let bytes = u64::from(args.n) * u64::from(args.k) / 2;
        match moe.prepared_overlap(args.w, bytes) {
            None => Ok(()),
            Some((b, e)) => Err(RuntimeError::InvalidArgument(format!(
                "w at {:#x}: the codes lie in {b:#x}..{e:#x}, prepared for the grouped MoE kernels \
                 (not the ModelOpt order GEMM kernels read); restore them first \
                 (MoeOps::restore_weights, fp4tune_moe_restore_weights)",
                args.w
            ))),
        }
    }

    /// [`Dispatcher::gemm`] with `ws` as the scratch memory: launches on different streams, each
    /// with its own workspace, never share scratch and may run at the same time. No allocation,
    /// no synchronization, no exclusive lock (a shared read of the prepared grouped weights'
    /// list, and a short lock counting launches of shapes outside the table): capturable into a
    /// CUDA graph. A launch that needs more than
    /// `ws` holds (M above its `max_m` on a split-K or dequantize-then-cuBLAS route, or a shape
    /// outside the table whose fallback uses split-K) is refused before anything is enqueued
    /// ([`RuntimeError::WorkspaceTooSmall`]), as is a workspace of another dispatcher.
    ///
    /// # Safety
    /// As [`Dispatcher::gemm`] for the operands and `stream`; `ws` must not be used by launches on
    /// other streams until this launch completes (launches on one stream are ordered by it).
    pub unsafe fn gemm_in(
        &self,
        args: &GemmArgs,
        ws: &GemmWorkspace,
        stream: RawStream,
    ) -> Result<Route, RuntimeError> {
        validate(args)?;
        self.refuse_prepared_codes(args)?;
        if ws.owner != self.id {
            return Err(RuntimeError::ForeignWorkspace);
        }
        let p = GemmProblem::new(args.m, args.n, args.k, args.a_type);
        let (idx, kind, method) = self.route_index(&p)?;
        // SAFETY: the caller's buffer, stream and workspace contract.
        unsafe { self.launch(idx, kind, method, args, &p, Some(ws), stream) }
    }

    /// Enqueue the routed launch on `stream` with `ws` as its scratch (refused, before anything
    /// is enqueued, when the launch needs more than `ws` holds; `None` holds nothing).
    ///
    /// # Safety
    /// As [`Dispatcher::gemm_in`]; `args` validated, `(idx, method)` from `route_index` for `p`.
    #[allow(clippy::too_many_arguments)]
    unsafe fn launch(
        &self,
        idx: usize,
        kind: RouteKind,
        method: Method,
        args: &GemmArgs,
        p: &GemmProblem,
        ws: Option<&GemmWorkspace>,
        stream: RawStream,
    ) -> Result<Route, RuntimeError> {
        let loaded = &self.kernels[idx];
        let config = loaded.config;
        let need = ScratchSizes::of_launch(&config, p, method);
        let (have, max_m) = ws.map_or((ScratchSizes::default(), 0), |w| (w.capacity(), w.max_m()));
        check_capacity(&have, max_m, &need, p)?;
        if let (Method::DequantCublasBf16, Some(composite)) = (method, &self.composite) {
            let ops = Operands {
                a: args.a,
                a_sf: args.a_sf,
                w: args.w,
                w_sf: args.w_sf,
                y: args.y,
                alpha: args.alpha,
            };
            // The capacity check above guarantees a workspace here.
            let (expand, blas) = ws.map_or((0, None), |w| (w.composite(), Some(w.blas())));
            // SAFETY: caller's buffer/stream contract; the workspace's expansion region and cuBLAS
            // region hold what this launch needs (checked above), outlive it (a workspace is
            // dropped only after its launches completed: its contract; the dispatcher's own one
            // only after a device synchronization) and no other stream's launch uses them
            // meanwhile (the contract of `gemm` and `gemm_in`).
            unsafe { composite.launch_with(&self.gpu, p, &ops, expand, blas, stream) }?;
            return Ok(Route { config, method, kind });
        }
        let (workspace, counters) =
            if config.split_k > 1 { ws.map_or((0, 0), |w| w.split_k()) } else { (0, 0) };
        let params = GemmParams {
            a: args.a,
            a_sf: args.a_sf,
            w: args.w,
            w_sf: args.w_sf,
            y: args.y,
            workspace,
            counters,
            m: args.m as i32,
            n: args.n as i32,
            k: args.k as i32,
            alpha: args.alpha,
        };
        let dims = config.launch_dims(p);
        // SAFETY: caller's buffer/stream contract. With split-K, the workspace and counters hold
        // at least what this launch needs (checked above), the counters are zero between launches
        // (zeroed at creation, and the kernel leaves them zeroed), they outlive the launch and no
        // other stream's launch uses them meanwhile (as above); without split-K no scratch is
        // read or written.
        unsafe { self.gpu.launch_on_stream(&loaded.kernel, dims, &params, stream)? };
        Ok(Route { config, method: Method::Fused, kind })
    }

    /// Replace the dispatcher's own workspace by one that holds `need` (each short kind at least
    /// doubled) and M up to `m` (slow path): refused during graph capture; otherwise waits for the
    /// whole device (the old buffer may be in use on any stream), then allocates the new one.
    ///
    /// # Safety
    /// `stream` must be 0 or a live stream of the primary context.
    #[cold]
    unsafe fn grow(
        &self,
        ws: &mut GemmWorkspace,
        need: &ScratchSizes,
        m: u32,
        stream: RawStream,
    ) -> Result<(), RuntimeError> {
        let capacity = ws.capacity().grown_for(need);
        // SAFETY: forwarded stream contract.
        if unsafe { self.gpu.stream_is_capturing(stream)? } {
            return Err(RuntimeError::WorkspaceDuringCapture {
                needed_bytes: capacity.bytes(),
                have_bytes: ws.bytes(),
            });
        }
        self.gpu.synchronize_device()?;
        *ws = GemmWorkspace::new(&self.gpu, self.id, ws.max_m().max(m), capacity)?;
        Ok(())
    }

    /// Wait for `stream` (0 = the legacy default stream); surfaces asynchronous kernel errors.
    ///
    /// # Safety
    /// `stream` must be 0 or a live stream of this device's primary context.
    pub unsafe fn synchronize(&self, stream: RawStream) -> Result<(), RuntimeError> {
        // SAFETY: forwarded contract.
        unsafe { self.gpu.synchronize_stream(stream) }.map_err(Into::into)
    }
}

impl Drop for Dispatcher {
    fn drop(&mut self) {
        // Kernels of ours may still run on the caller's streams: wait before the modules and the
        // workspace go. Errors cannot be reported from a drop and are ignored.
        let _ = self.gpu.synchronize_device();
    }
}

/// The plan's scratch for M <= `max_m`, without the dequantize-then-cuBLAS parts when cuBLAS was
/// not loaded (those entries then run their fused fallback kernel, which the plan counts too).
fn scratch_with(plan: &Plan, max_m: u32, composite: bool) -> ScratchSizes {
    let s = plan.scratch(max_m);
    if composite {
        s
    } else {
        ScratchSizes { composite_elems: 0, blas_bytes: 0, ..s }
    }
}

/// The alignment, in bytes, each operand of [`Dispatcher::gemm`] must have: the kernels load `a`
/// and `w` with 16-byte `cp.async` and vector loads, and read the scales and store `y` (bf16
/// pairs) 4 bytes at a time. A misaligned address faults the kernel, and a faulted CUDA context
/// ends the serving process: such calls are refused before the launch.
const ALIGN_A: u64 = 16;
/// See [`ALIGN_A`].
const ALIGN_W: u64 = 16;
/// Alignment of the swizzled scale buffers `w_sf` and (W4A4) `a_sf`; see [`ALIGN_A`].
const ALIGN_SCALES: u64 = 4;
/// See [`ALIGN_A`].
const ALIGN_Y: u64 = 4;

/// Refuse a GEMM the kernels cannot run safely: empty or oversized dimensions, K not a multiple
/// of 16, a null or misaligned device pointer ([`ALIGN_A`] and the like).
fn validate(a: &GemmArgs) -> Result<(), RuntimeError> {
    let bad = |s: String| Err(RuntimeError::InvalidArgument(s));
    if a.m == 0 || a.n == 0 || a.k == 0 {
        return bad(format!("empty GEMM M={} N={} K={}", a.m, a.n, a.k));
    }
    let limit = i32::MAX as u32;
    if a.m > limit || a.n > limit || a.k > limit {
        return bad(format!("M={} N={} K={} must fit in a signed 32-bit int", a.m, a.n, a.k));
    }
    if a.k % 16 != 0 {
        return bad(format!("K={} is not a multiple of the NVFP4 block size 16", a.k));
    }
    for (name, ptr) in [("a", a.a), ("w", a.w), ("w_sf", a.w_sf), ("y", a.y)] {
        if ptr == 0 {
            return bad(format!("null device pointer `{name}`"));
        }
    }
    if a.a_type == AType::Nvfp4 && a.a_sf == 0 {
        return bad("null device pointer `a_sf` (W4A4 needs the activation scales)".into());
    }
    const RULE: &str =
        "the kernels need `a` and `w` 16-byte aligned, the scales and `y` 4-byte aligned";
    for (name, ptr, align) in [
        ("a", a.a, ALIGN_A),
        ("w", a.w, ALIGN_W),
        ("w_sf", a.w_sf, ALIGN_SCALES),
        ("y", a.y, ALIGN_Y),
    ] {
        super::error::check_pointer(name, ptr, align, RULE)?;
    }
    // W4A16 does not read `a_sf`.
    if a.a_type == AType::Nvfp4 {
        super::error::check_pointer("a_sf", a.a_sf, ALIGN_SCALES, RULE)?;
    }
    Ok(())
}

#[cfg(test)]
#[path = "dispatcher_tests.rs"]
mod tests;
