//! The runtime dispatcher serving code links (Rust directly, C and Python through `ffi`): open a
//! dispatch table, compile or load every kernel it names, then launch the right one by shape.
//!
//! # Start-up ([`Dispatcher::open`])
//! 1. open the device (its primary context: the one PyTorch and the CUDA runtime use, so their
//!    device pointers and streams work here);
//! 2. load and validate the table, check it against the device and the compiled-in template
//!    sources ([`crate::table::MismatchPolicy`]);
//! 3. plan ([`Plan`], GPU-free): per (N, K, A type) the table's buckets for the device's family, the
//!    common configurations and the family defaults (so every fallback is already loaded), and
//!    the scratch the table's routes need up to `Options::max_m` ([`ScratchSizes`]);
//! 4. render and compile every planned kernel in parallel through [`crate::compile::Compiler`] and
//!    its on-disk CUBIN cache (a missing cache folder is created; one that cannot be created is an
//!    error naming it), load them, allocate the dispatcher's own workspace, and report the
//!    start-up time ([`StartupReport`]).
//!
//! No tuning, no search, no benchmarking here: `runtime` depends on `table`, `moe`, `template`,
//! `compile`, `format`, `problem` and `gpu` only (`bench` and `tune` use [`composite`] from
//! here).
//!
//! # Launch ([`Dispatcher::gemm_in`], [`Dispatcher::gemm`])
//! A `HashMap` lookup of (N, K, A type), a binary search over the shape's buckets (smallest
//! bucket >= M, else the largest), the configuration's problem check, one `cuLaunchKernel` on the
//! caller's stream. Nothing is allocated, compiled or synchronized on this path. Shapes the table
//! does not know take a slower path (the table's lookup with fallback, ~1 us) and are recorded once
//! each as a warning ([`Dispatcher::fallbacks`]).
//!
//! Split-K kernels need scratch (partial sums and tile counters), and so do entries whose method
//! is `DequantCublasBf16` (the tuner measured it faster than every fused kernel, at large M):
//! they launch [`composite::DequantGemm`], fp4tune's kernel expanding W (and NVFP4 A) into bf16
//! scratch, then cuBLAS BF16 with its own workspace, on the caller's stream. cuBLAS is set up at
//! open only when the table has such entries; if it cannot be loaded, those entries run their
//! fallback fused kernel (`Entry::config`) and the start-up report says so.
//!
//! Scratch lives in a [`GemmWorkspace`] (one device buffer for all of it): the caller creates one
//! per stream ([`Dispatcher::gemm_workspace`], sized at creation for every route of the table up
//! to a largest M) and passes it to [`Dispatcher::gemm_in`], so launches on different streams
//! (two micro-batches on two streams) never share scratch, and a launch allocates and
//! synchronizes nothing and takes no exclusive lock (capturable into a CUDA graph; it reads the
//! prepared grouped codes under a shared lock, which only preparing or restoring them takes
//! exclusively). [`Dispatcher::gemm`] uses the dispatcher's
//! own workspace instead, for callers on one stream: sized at open for `Options::max_m`, it grows
//! under a lock when a launch needs more, which waits for the device and is therefore refused
//! while the stream is being captured.
//!
//! # Grouped MoE ([`Dispatcher::moe`], [`moe`])
//! A table's `moe` entries are loaded at open (per layer shape, per projection and token count):
//! the caller makes one [`moe::MoeWorkspace`] per stream, then launches the whole layer (align,
//! gate_up with SiLU(gate) * up, down, the router-weighted sum) or its steps on its own stream.
//! The kernel of each step is the entry whose token count B is nearest in log scale. Scratch
//! lives in the workspace, never shared between streams. The C ABI is `fp4tune_moe_*`.
//!
//! # Routes (`route.rs`)
//! [`Dispatcher::route`] says which kernel (or the dequantize-then-cuBLAS method) a GEMM shape
//! launches and why: its bucket of M, or the fallback for a shape the table does not know.
//! [`Dispatcher::moe_route`] says the same of the grouped operations: per op the kernel of the
//! token bucket B nearest in log scale, why that bucket (exact, between two buckets, outside the
//! tuned range), and whether the entries were tuned with other grouped templates; a layer without
//! grouped routes is an error saying why. Both print as one line (`fp4tune_route`,
//! `fp4tune_moe_route`).

pub mod composite;
mod dispatcher;
mod error;
pub mod moe;
mod plan;
mod route;
mod workspace;

#[cfg(test)]
mod gpu_tests;

pub use dispatcher::{Dispatcher, GemmArgs, Options, StartupReport};
pub use error::RuntimeError;
pub use plan::{family_for, Plan, PlannedKernel};
pub use route::{MoeLayerRoute, MoeRoute, MoeRouteKind, MoeRouteTable, Route, RouteKind};
pub use workspace::{GemmWorkspace, ScratchSizes, BLAS_WORKSPACE_BYTES};
