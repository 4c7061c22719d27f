//! The grouped layers of a dispatcher at run time: per layer shape and activation type the
//! kernels chosen per token count (nearest bucket in log scale), from the table's entries or, for
//! a layer the table has none for, from the family defaults (`moe::defaults`, compiled when the
//! layer's first workspace is created), and the operations an open dispatcher exposes.

use super::*;

/// The kernels of one layer shape and activation type, chosen per token count: (bucket, index
/// into `kernels`) per op, buckets ascending; a token count takes the nearest bucket in log scale
/// (ties: the larger). Buckets that chose the same configuration share one loaded kernel.
#[derive(Debug)]
pub struct MoeRoutes {
    pub shape: MoeShape,
    pub a_type: AType,
    /// The model's routed experts the family defaults were chosen for (`None`: the table's
    /// entries).
    defaults_for: Option<u32>,
    kernels: Vec<GroupedKernel>,
    gate_up: Vec<(u32, usize)>,
    down: Vec<(u32, usize)>,
}

impl MoeRoutes {
    /// Load every (op, bucket, config) of one shape and activation type: the distinct
    /// configurations compiled in parallel, each loaded once. A table's kernel that this
    /// device's compiler makes spill registers still loads (it was verified and timed when the
    /// table was tuned; the spill costs time, not correctness), with a warning in `warnings`.
    pub fn load(
        gpu: &Gpu,
        compiler: &Compiler,
        shape: MoeShape,
        a_type: AType,
        choices: &[(MoeOp, u32, GroupedConfig)],
        warnings: &mut Vec<String>,
    ) -> Result<Self, RuntimeError> {
        if shape.hidden % 16 != 0 || shape.inter % 16 != 0 {
            return Err(RuntimeError::InvalidArgument(format!(
                "{shape}: hidden and inter must be multiples of 16"
            )));
        }
        let family = crate::runtime::family_for(gpu.info())?;
        let mut configs: Vec<GroupedConfig> = Vec::new();
        for (_, _, c) in choices {
            c.check(&shape)
                .map_err(|e| RuntimeError::Render { config: c.name(), reason: e.reason })?;
            if c.a_type != a_type || c.family != family {
                return Err(RuntimeError::Render {
                    config: c.name(),
                    reason: format!(
                        "a {} {} kernel in the {} {family} routes",
                        c.family, c.a_type, a_type
                    ),
                });
            }
            if !configs.contains(c) {
                configs.push(*c);
            }
        }
        let sources: Vec<_> = configs.iter().map(|c| c.source()).collect();
        let mut kernels = Vec::with_capacity(configs.len());
        for ((c, src), r) in configs.iter().zip(&sources).zip(compiler.compile_many(&sources)) {
            let compiled = r.map_err(|error| RuntimeError::Compile {
                config: src.kernel_name.clone(),
                error,
            })?;
            let kernel = GroupedKernel::from_compiled_with_spills(gpu, *c, &compiled)?;
            if let Some(why) = kernel.spills(&compiled)? {
                warnings.push(format!(
                    "grouped kernel {} with this compiler: {why}; it runs, perhaps slower than \
                     where it was measured (a tune, `fp4tune tune --moe-only`, picks one that \
                     does not spill)",
                    c.name()
                ));
            }
            kernels.push(kernel);
        }
        let index =
            |c: &GroupedConfig| configs.iter().position(|x| x == c).expect("collected above");
        let mut routes =
            MoeRoutes { shape, a_type, defaults_for: None, kernels, gate_up: vec![], down: vec![] };
        for (op, bucket, config) in choices {
            let k = index(config);
            match op {
                MoeOp::GateUp => routes.gate_up.push((*bucket, k)),
                MoeOp::Down => routes.down.push((*bucket, k)),
            }
        }
        routes.gate_up.sort_by_key(|(b, _)| *b);
        routes.down.sort_by_key(|(b, _)| *b);
        if routes.gate_up.is_empty() || routes.down.is_empty() {
            return Err(RuntimeError::InvalidArgument(format!(
                "{shape} ({a_type}): the table has no grouped gate_up or down entry"
            )));
        }
        Ok(routes)
    }

    /// The kernel for `tokens` of `op`.
    pub fn pick(&self, op: MoeOp, tokens: u32) -> &GroupedKernel {
        let list = match op {
            MoeOp::GateUp => &self.gate_up,
            MoeOp::Down => &self.down,
        };
        &self.kernels[list[nearest_bucket(list.iter().map(|(b, _)| *b), tokens)].1]
    }
}

/// Index of the bucket nearest to `tokens` in log scale (ties: the larger); `buckets` ascending,
/// not empty.
pub fn nearest_bucket(buckets: impl Iterator<Item = u32>, tokens: u32) -> usize {
    let t = (tokens.max(1) as f64).ln();
    let mut best = (f64::INFINITY, 0usize);
    for (i, b) in buckets.enumerate() {
        let d = ((b.max(1) as f64).ln() - t).abs();
        if d <= best.0 {
            best = (d, i);
        }
    }
    best.1
}

/// The grouped layers of a dispatcher: the table's, loaded at open, and the family defaults of
/// the others, loaded by their first workspace; the fixed kernels.
#[derive(Debug)]
pub struct MoeRuntime {
    kernels: MoeKernels,
    /// Grows only (a layer's routes never change once loaded); launches take a shared read.
    layers: std::sync::RwLock<Vec<std::sync::Arc<MoeRoutes>>>,
    family: crate::template::Family,
    /// The dispatcher's compiler: builds the family defaults of a layer at its first workspace.
    compiler: std::sync::Arc<Compiler>,
    /// Warnings of the default layers loaded since open (a default kernel that spills).
    notes: std::sync::Mutex<Vec<String>>,
    /// Held while a layer's defaults are built (one build at a time).
    build: std::sync::Mutex<()>,
    /// The weight codes put into the grouped kernels' layout (`MoeOps::prepare_weights`);
    /// grouped launches read only codes of their own projection inside one of them, GEMM
    /// launches none (`Dispatcher::gemm` asks `prepared_overlap`).
    prepared: std::sync::RwLock<Vec<Prepared>>,
}

/// One prepared projection: `stack` at `begin`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Prepared {
    begin: u64,
    stack: CodeStack,
}

impl Prepared {
    fn end(&self) -> u64 {
        self.begin + self.stack.bytes()
    }
}

/// The first of `ranges` that `[codes, end)` overlaps, as `(begin, end)`.
fn first_overlap(ranges: &[Prepared], codes: u64, end: u64) -> Option<(u64, u64)> {
    ranges.iter().find(|r| codes < r.end() && r.begin < end).map(|r| (r.begin, r.end()))
}

impl MoeRuntime {
    /// Load the fixed kernels and the table's grouped entries (grouped by layer shape; entries of
    /// this device's family: `route::own_grouped`), with `compiler`, which also builds the family
    /// defaults of later layers. A table whose grouped templates differ from this build's loads
    /// anyway (the kernels are rebuilt from this build's templates) with a warning pushed to
    /// `warnings`.
    pub fn load(
        gpu: &Gpu,
        compiler: std::sync::Arc<Compiler>,
        table: Option<&crate::table::Table>,
        warnings: &mut Vec<String>,
    ) -> Result<Self, RuntimeError> {
        let family = crate::runtime::family_for(gpu.info())?;
        let mut runtime = MoeRuntime {
            kernels: MoeKernels::load(gpu, &compiler)?,
            layers: std::sync::RwLock::new(Vec::new()),
            family,
            compiler,
            notes: std::sync::Mutex::new(Vec::new()),
            build: std::sync::Mutex::new(()),
            prepared: std::sync::RwLock::new(Vec::new()),
        };
        let Some(table) = table.filter(|t| !t.moe.is_empty()) else {
            return Ok(runtime);
        };
        if table.moe_templates_stale() {
            warnings.push(
                "the grouped MoE entries were tuned with other kernel templates: their kernels are built from \
                 this build's templates, their recorded times may not hold (re-tune with `fp4tune tune --moe-only`)"
                    .into(),
            );
        }
        let mut layers_of: Vec<(MoeShape, AType)> = Vec::new();
        for e in &table.moe {
            let layer = (e.key.shape(), e.key.a_type);
            if !layers_of.contains(&layer) {
                layers_of.push(layer);
            }
        }
        let mut layers = Vec::with_capacity(layers_of.len());
        for (shape, a_type) in layers_of {
            let choices: Vec<_> = table
                .moe
                .iter()
                .filter(|e| e.key.shape() == shape && e.key.a_type == a_type)
                .map(|e| (e.key.op, e.key.tokens, e.config))
                .collect();
            let routes =
                MoeRoutes::load(gpu, &runtime.compiler, shape, a_type, &choices, warnings)?;
            layers.push(std::sync::Arc::new(routes));
        }
        runtime.layers = std::sync::RwLock::new(layers);
        Ok(runtime)
    }

    /// The loaded layers, to read (append-only: a poisoned lock still holds whole layers).
    fn layers(&self) -> std::sync::RwLockReadGuard<'_, Vec<std::sync::Arc<MoeRoutes>>> {
        self.layers.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether `shape` is loaded; an error when its family defaults were built for a model of
    /// other routed experts than `experts_total` (a layer's kernels are chosen once).
    pub fn loaded(&self, shape: &MoeShape, experts_total: u32) -> Result<bool, RuntimeError> {
        let layers = self.layers();
        let mut of_shape = layers.iter().filter(|l| l.shape == *shape).peekable();
        let found = of_shape.peek().is_some();
        if let Some(built) = of_shape.find_map(|l| l.defaults_for.filter(|&b| b != experts_total)) {
            return Err(RuntimeError::InvalidArgument(format!(
                "the layer {shape} runs the family defaults its first workspace chose for a model \
                 of {built} routed experts; this call names {experts_total}"
            )));
        }
        Ok(found)
    }

    /// Load the family defaults of `shape`, a layer the table has no entries for, in a model of
    /// `experts_total` routed experts, for every activation type the family runs it with;
    /// nothing for a layer already loaded (the table's layers run their entries only: an
    /// activation type the table lacks for them stays refused). An error (the family's one line
    /// on what its kernels take) when the family runs the layer with neither, and when the
    /// layer's defaults were loaded for another `experts_total`.
    fn ensure_layer(
        &self,
        gpu: &Gpu,
        shape: MoeShape,
        experts_total: u32,
    ) -> Result<(), RuntimeError> {
        crate::moe::defaults::check_experts_total(&shape, experts_total)
            .map_err(RuntimeError::InvalidArgument)?;
        if self.loaded(&shape, experts_total)? {
            return Ok(());
        }
        // one build at a time, so no layer is compiled and loaded twice; launches (a shared read
        // of the layers) go on meanwhile
        let _build = self.build.lock().unwrap_or_else(|e| e.into_inner());
        if self.loaded(&shape, experts_total)? {
            return Ok(());
        }
        let mut built = Vec::new();
        let mut why = None;
        let sms = gpu.info().sm_count;
        for a_type in [AType::Bf16, AType::Nvfp4] {
            if let Err(e) = crate::moe::space::check_layer(self.family, a_type, &shape) {
                why.get_or_insert(e);
                continue;
            }
            let choices = crate::moe::defaults::default_routes(
                self.family,
                a_type,
                &shape,
                experts_total,
                sms,
            )
            .map_err(RuntimeError::InvalidArgument)?;
            let mut notes = Vec::new();
            let routes = MoeRoutes::load(gpu, &self.compiler, shape, a_type, &choices, &mut notes)?;
            let routes = MoeRoutes { defaults_for: Some(experts_total), ..routes };
            built.push(std::sync::Arc::new(routes));
            self.notes.lock().unwrap_or_else(|e| e.into_inner()).extend(notes);
        }
        if built.is_empty() {
            return Err(RuntimeError::InvalidArgument(why.unwrap_or_default()));
        }
        let cache = self.compiler.cache_warning().map(str::to_string);
        self.notes.lock().unwrap_or_else(|e| e.into_inner()).extend(cache);
        self.layers.write().unwrap_or_else(|e| e.into_inner()).extend(built);
        Ok(())
    }

    /// Warnings of the family defaults loaded since open (a default kernel this compiler makes
    /// spill still runs, perhaps slower; a cubin cache that could not store), each once.
    pub fn warnings(&self) -> Vec<String> {
        let mut v = self.notes.lock().unwrap_or_else(|e| e.into_inner()).clone();
        v.dedup();
        v
    }

    /// The prepared range that `bytes` of codes at `codes` overlap, if any. (A poisoned lock
    /// still holds a consistent list: it changes only after the launch that goes with it
    /// succeeded.)
    pub fn prepared_overlap(&self, codes: u64, bytes: u64) -> Option<(u64, u64)> {
        first_overlap(&self.prepared(), codes, codes.saturating_add(bytes))
    }

    /// The prepared ranges, to read (see `prepared_overlap` on poisoning).
    fn prepared(&self) -> std::sync::RwLockReadGuard<'_, Vec<Prepared>> {
        self.prepared.read().unwrap_or_else(|e| e.into_inner())
    }

    fn routes(
        &self,
        shape: &MoeShape,
        a_type: AType,
    ) -> Result<std::sync::Arc<MoeRoutes>, RuntimeError> {
        let layers = self.layers();
        let found = layers.iter().find(|l| l.shape == *shape && l.a_type == a_type);
        found.cloned().ok_or_else(|| {
            let runs: Vec<String> =
                layers.iter().filter(|l| l.shape == *shape).map(|l| l.a_type.to_string()).collect();
            let why = match crate::moe::space::check_layer(self.family, a_type, shape) {
                Err(e) => e,
                Ok(()) if runs.is_empty() => {
                    "not loaded yet: its first workspace loads it (MoeOps::workspace, \
                     fp4tune_moe_workspace_create)"
                        .into()
                }
                Ok(()) => format!(
                    "the table has its {} entries only (tune {a_type} with `fp4tune tune \
                     --a-type {a_type}`)",
                    runs.join(", ")
                ),
            };
            RuntimeError::InvalidArgument(format!(
                "no {a_type} grouped kernels for the layer {shape}: {why}"
            ))
        })
    }
}

/// The grouped operations of an open dispatcher (`Dispatcher::moe`).
#[derive(Debug, Clone, Copy)]
pub struct MoeOps<'a> {
    pub(in crate::runtime) gpu: &'a Gpu,
    pub(in crate::runtime) runtime: &'a MoeRuntime,
    /// The dispatcher's id: the owner of the workspaces it creates, the only ones it launches in.
    pub(in crate::runtime) owner: u64,
}

impl MoeOps<'_> {
    fn launcher(&self) -> MoeLauncher<'_> {
        MoeLauncher { gpu: self.gpu, kernels: &self.runtime.kernels }
    }

    /// A workspace for one stream's launches of `shape` with up to `max_tokens` tokens (both
    /// activation types), in a model of `experts_total` routed experts, the ids its router gives
    /// (`shape.experts` when every expert is on this GPU; GLM-5 over 8 GPUs by experts: 256 for a
    /// layer of 32; a shared expert joined as one more counts). The
    /// first workspace of a layer the table has no entries for loads the layer's family defaults,
    /// chosen for the rows per expert a uniform routing over `experts_total` gives (compiled, or
    /// taken from the cubin cache): create it before capturing a graph, as any workspace. Later
    /// workspaces of such a layer must name the same `experts_total`.
    pub fn workspace(
        &self,
        shape: MoeShape,
        experts_total: u32,
        max_tokens: u32,
    ) -> Result<MoeWorkspace, RuntimeError> {
        self.runtime.ensure_layer(self.gpu, shape, experts_total)?;
        let mut ws = MoeWorkspace::new(self.gpu, shape, max_tokens)?;
        ws.owner = self.owner;
        Ok(ws)
    }

    /// Refuse a workspace another dispatcher created (another device's memory, or scratch that
    /// another dispatcher's streams use).
    fn check_owner(&self, ws: &MoeWorkspace) -> Result<(), RuntimeError> {
        if ws.owner != self.owner {
            return Err(RuntimeError::ForeignWorkspace);
        }
        Ok(())
    }

    /// The configurations the W4A16 layer launches for `tokens` (gate_up, down), no launch.
    pub fn route(
        &self,
        shape: &MoeShape,
        tokens: u32,
    ) -> Result<(GroupedConfig, GroupedConfig), RuntimeError> {
        self.route_for(shape, AType::Bf16, tokens)
    }

    /// Warnings of the family defaults loaded since open (`MoeRuntime::warnings`).
    pub fn warnings(&self) -> Vec<String> {
        self.runtime.warnings()
    }

    /// The configurations the layer of activation type `a_type` launches for `tokens`.
    pub fn route_for(
        &self,
        shape: &MoeShape,
        a_type: AType,
        tokens: u32,
    ) -> Result<(GroupedConfig, GroupedConfig), RuntimeError> {
        let r = self.runtime.routes(shape, a_type)?;
        Ok((r.pick(MoeOp::GateUp, tokens).config, r.pick(MoeOp::Down, tokens).config))
    }

    /// The prepared ranges, for a change (see `MoeRuntime::prepared_overlap` on poisoning).
    fn prepared_mut(&self) -> std::sync::RwLockWriteGuard<'_, Vec<Prepared>> {
        self.runtime.prepared.write().unwrap_or_else(|e| e.into_inner())
    }

    /// Refuse a permutation enqueued into a graph capture: it would run at every replay.
    ///
    /// # Safety
    /// `stream` must be 0 or a live stream of the device's primary context.
    unsafe fn refuse_capture(&self, what: &str, stream: RawStream) -> Result<(), RuntimeError> {
        // SAFETY: the stream per this function's contract.
        if unsafe { self.gpu.stream_is_capturing(stream)? } {
            return Err(RuntimeError::InvalidArgument(format!(
                "{what}: the stream is capturing a CUDA graph (the permutation would run at every \
                 replay); prepare or restore weights outside capture"
            )));
        }
        Ok(())
    }

    /// Put one projection's weight codes (`w13` or `w2` of every local expert of `shape`, no
    /// scales, at `codes`) into the layout this device's grouped kernels read (`moe::order`), in
    /// place, on `stream`, once after loading, before the first launch that reads them; returns
    /// once the codes are in place (the permutation goes through a scratch copy that lives for
    /// the call). Codes overlapping codes prepared before are refused (a second pass would
    /// scramble them), and so is a stream that is capturing a graph; grouped launches refuse
    /// weights outside the ranges prepared for their projection and shape, GEMM launches weights
    /// inside any. Before the memory is freed or overwritten: `restore_weights` (the ModelOpt
    /// bytes back) or `forget_weights`.
    ///
    /// # Safety
    /// `codes` must be the projection's codes on this device (`shape.experts` experts of its
    /// rows x k / 2 bytes), not read or written by other work until the call returns; `stream`
    /// 0 or a live stream of the device's primary context.
    pub unsafe fn prepare_weights(
        &self,
        shape: &MoeShape,
        op: MoeOp,
        codes: u64,
        stream: RawStream,
    ) -> Result<(), RuntimeError> {
        let stack = CodeStack::of(shape, op);
        let end = check_codes(codes, stack)?;
        let mut prepared = self.prepared_mut();
        if let Some((b, e)) = first_overlap(&prepared, codes, end) {
            return Err(RuntimeError::InvalidArgument(format!(
                "weight codes {codes:#x}..{end:#x} overlap codes prepared before ({b:#x}..{e:#x}): \
                 a second pass would scramble them"
            )));
        }
        // SAFETY: the stream per this function's contract.
        unsafe { self.refuse_capture("preparing weight codes", stream) }?;
        // SAFETY: forwarded to the caller (see the function's contract).
        unsafe { self.launcher().order_weights(codes, stack, false, stream) }?;
        prepared.push(Prepared { begin: codes, stack });
        Ok(())
    }

    /// The index of the range prepared for `stack` at `codes` exactly.
    fn take_prepared(
        prepared: &[Prepared],
        stack: CodeStack,
        codes: u64,
    ) -> Result<usize, RuntimeError> {
        prepared.iter().position(|r| r.begin == codes && r.stack == stack).ok_or_else(|| {
            RuntimeError::InvalidArgument(format!(
                "{} codes at {codes:#x} ({} experts of {} x {}) were not prepared by this \
                 dispatcher (restore and forget take exactly the codes and shape that were \
                 prepared)",
                stack.op, stack.experts, stack.n, stack.k
            ))
        })
    }

    /// Put codes prepared by `prepare_weights` (the same shape, projection and `codes`) back
    /// into the ModelOpt layout, in place, on `stream`, and forget them; returns once done.
    ///
    /// # Safety
    /// As `prepare_weights`; no grouped launch reading them may be pending.
    pub unsafe fn restore_weights(
        &self,
        shape: &MoeShape,
        op: MoeOp,
        codes: u64,
        stream: RawStream,
    ) -> Result<(), RuntimeError> {
        let stack = CodeStack::of(shape, op);
        let mut prepared = self.prepared_mut();
        let at = Self::take_prepared(&prepared, stack, codes)?;
        // SAFETY: the stream per this function's contract.
        unsafe { self.refuse_capture("restoring weight codes", stream) }?;
        // SAFETY: forwarded to the caller (see the function's contract).
        unsafe { self.launcher().order_weights(codes, stack, true, stream) }?;
        prepared.remove(at);
        Ok(())
    }

    /// Forget codes prepared by `prepare_weights` (the same shape, projection and `codes`)
    /// without touching them: before their memory is freed or overwritten by other data (a
    /// later allocation at the same address is not prepared).
    pub fn forget_weights(
        &self,
        shape: &MoeShape,
        op: MoeOp,
        codes: u64,
    ) -> Result<(), RuntimeError> {
        let mut prepared = self.prepared_mut();
        let at = Self::take_prepared(&prepared, CodeStack::of(shape, op), codes)?;
        prepared.remove(at);
        Ok(())
    }

    /// `Ok` when op's weight codes of `args` lie inside one prepared range.
    fn check_prepared(
        &self,
        op: MoeOp,
        args: &MoeArgs,
        shape: &MoeShape,
    ) -> Result<(), RuntimeError> {
        let (what, codes) = match op {
            MoeOp::GateUp => ("w13", args.w13),
            MoeOp::Down => ("w2", args.w2),
        };
        let stack = CodeStack::of(shape, op);
        let bytes = stack.bytes();
        let end = codes.saturating_add(bytes);
        // inside a range of the same projection and rows, on an expert boundary of it
        let fits = |r: &Prepared| {
            (r.stack.op, r.stack.n, r.stack.k) == (op, stack.n, stack.k)
                && r.begin <= codes
                && end <= r.end()
                && (codes - r.begin).checked_rem(stack.expert_bytes()) == Some(0)
        };
        if self.runtime.prepared().iter().any(fits) {
            return Ok(());
        }
        Err(RuntimeError::InvalidArgument(format!(
            "{what} at {codes:#x} ({bytes} bytes of codes): not prepared for the grouped kernels \
             as {op} codes of {} x {}; call MoeOps::prepare_weights (C: \
             fp4tune_moe_prepare_weights) on the layer's {what} once after loading",
            stack.n, stack.k
        )))
    }

    /// The whole layer on `stream`: align, (W4A4 with bf16 X) the quantization of X, gate_up
    /// (SiLU(gate) * up into the workspace), down, and the router-weighted sum into `args.y`.
    /// No allocation, no synchronization.
    ///
    /// # Safety
    /// Every pointer of `args` must be a device buffer of this context of the documented size
    /// (`MoeArgs`) for `ws.shape` and `args.tokens`, alive until the work on `stream` completes;
    /// `ws` must not be used by launches on other streams meanwhile; `stream` 0 or a live stream
    /// of the device's primary context.
    pub unsafe fn layer(
        &self,
        args: &MoeArgs,
        ws: &MoeWorkspace,
        stream: RawStream,
    ) -> Result<(), RuntimeError> {
        self.check_owner(ws)?;
        let r = self.runtime.routes(&ws.shape, args.a_type())?;
        self.check_prepared(MoeOp::GateUp, args, &ws.shape)?;
        self.check_prepared(MoeOp::Down, args, &ws.shape)?;
        let (gate_up, down) =
            (r.pick(MoeOp::GateUp, args.tokens), r.pick(MoeOp::Down, args.tokens));
        // a refused call leaves the workspace's record as it was; one that enqueues clears it
        // until every launch is in
        let launcher = self.launcher();
        launcher.check_layer(gate_up, down, args, ws)?;
        ws.set_aligned(None);
        // SAFETY: forwarded to the caller (see the function's contract).
        unsafe { launcher.enqueue_layer(gate_up, down, args, ws, stream) }?;
        ws.set_aligned(Some(args));
        Ok(())
    }

    /// moe_align alone: the routed-row schedule of `args.topk_ids` into `ws`.
    ///
    /// # Safety
    /// As `layer` (only `topk_ids` is read).
    pub unsafe fn align(
        &self,
        args: &MoeArgs,
        ws: &MoeWorkspace,
        stream: RawStream,
    ) -> Result<(), RuntimeError> {
        self.check_owner(ws)?;
        args.check_routing(ws.layout.max_tokens)?;
        ws.set_aligned(None);
        // SAFETY: forwarded to the caller (see the function's contract).
        unsafe { self.launcher().align(args, ws, stream) }?;
        ws.set_aligned(Some(args));
        Ok(())
    }

    /// gate_up alone over the schedule `align` wrote into `ws` for the same tokens: H (sorted
    /// order, `[rows, inter]` bf16; W4A4 also NVFP4) in the workspace (`MoeWorkspace::h`,
    /// `MoeWorkspace::h_fp4`). W4A4 with bf16 X quantizes X first.
    ///
    /// Refused when the last align enqueued into `ws` (alone or in `layer`) was not of this
    /// call's routing (its `topk_ids` buffer, tokens and expert range), or when there was none.
    ///
    /// # Safety
    /// As `layer`; `align` ran on `ws` for these tokens earlier on `stream`.
    pub unsafe fn gate_up(
        &self,
        args: &MoeArgs,
        ws: &MoeWorkspace,
        stream: RawStream,
    ) -> Result<(), RuntimeError> {
        args.validate(ws)?;
        self.check_owner(ws)?;
        let r = self.runtime.routes(&ws.shape, args.a_type())?;
        self.check_prepared(MoeOp::GateUp, args, &ws.shape)?;
        ws.check_aligned(args)?;
        // SAFETY: forwarded to the caller (see the function's contract).
        unsafe {
            if args.quantizes_x() {
                self.launcher().quantize_x(args, ws, stream)?;
            }
            self.launcher().grouped(r.pick(MoeOp::GateUp, args.tokens), args, ws, stream)
        }
    }

    /// down and the router-weighted sum into `args.y`, from the H in `ws` (refused as `gate_up`
    /// is when `ws` holds another routing's schedule).
    ///
    /// # Safety
    /// As `gate_up`; `gate_up` (or a caller's writes of H) happened on `ws` earlier on `stream`.
    pub unsafe fn down(
        &self,
        args: &MoeArgs,
        ws: &MoeWorkspace,
        stream: RawStream,
    ) -> Result<(), RuntimeError> {
        args.validate(ws)?;
        self.check_owner(ws)?;
        let r = self.runtime.routes(&ws.shape, args.a_type())?;
        self.check_prepared(MoeOp::Down, args, &ws.shape)?;
        ws.check_aligned(args)?;
        // SAFETY: forwarded to the caller (see the function's contract).
        unsafe {
            self.launcher().grouped(r.pick(MoeOp::Down, args.tokens), args, ws, stream)?;
            self.launcher().finalize(args, ws, stream)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_counts_take_the_nearest_bucket_in_log_scale() {
        let b = [1u32, 8, 64, 256];
        let pick = |t| b[nearest_bucket(b.iter().copied(), t)];
        assert_eq!(pick(1), 1);
        assert_eq!(pick(2), 1);
        assert_eq!(pick(3), 8);
        assert_eq!(pick(8), 8);
        assert_eq!(pick(20), 8);
        assert_eq!(pick(23), 64);
        assert_eq!(pick(100), 64);
        assert_eq!(pick(4096), 256);
    }
}
