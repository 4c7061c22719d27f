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
//!    the split-K workspace the table needs up to `Options::max_m`;
//! 4. render and compile every planned kernel in parallel through [`crate::compile::Compiler`] and
//!    its on-disk CUBIN cache (a missing cache folder is created; one that cannot be created is an
//!    error naming it), load them, allocate the workspace, and report the start-up time
//!    ([`StartupReport`]).
//!
//! No tuning, no search, no benchmarking here: `runtime` depends on `table`, `template`,
//! `compile` and `gpu` only (`bench` and `tune` use [`composite`] from here).
//!
//! # Launch ([`Dispatcher::gemm`])
//! A `HashMap` lookup of (N, K, A type), a binary search over the shape's buckets (smallest
//! bucket >= M, else the largest), the configuration's problem check, one `cuLaunchKernel` on the
//! caller's stream. Nothing is allocated, compiled or synchronized on this path. Shapes the table
//! does not know take a slower path (the table's lookup with fallback, ~1 us) and are recorded once
//! each as a warning ([`Dispatcher::fallbacks`]).
//!
//! Split-K kernels share one workspace and one set of tile counters owned by the dispatcher, sized
//! at open for the table's needs up to `max_m`. A launch that needs more grows them under the lock
//! outside the hot path: it synchronizes the device, so it is refused while the caller's stream is
//! being captured into a CUDA graph (warm every shape up before capturing, as serving engines do).
//! Split-K launches on *different* streams must be ordered by the caller (they share the
//! counters); launches on one stream, or without split-K, need nothing.
//!
//! Entries whose method is `DequantCublasBf16` (the tuner measured it faster than every fused
//! kernel, at large M) launch [`composite::DequantGemm`]: fp4tune's kernel expands W (and NVFP4
//! A) into a bf16 workspace owned by the dispatcher, then cuBLAS BF16 on the caller's stream.
//! cuBLAS and the workspace (N x K bf16 for the largest such shape, grown like the split-K one)
//! are set up at open only when the table has such entries; if cuBLAS cannot be loaded, those
//! entries run their fallback fused kernel (`Entry::config`) and the start-up report says so.
//! These launches share their workspace across streams like split-K launches.
//!
//! # Grouped MoE ([`Dispatcher::moe`], [`moe`])
//! A table's `moe` entries are loaded at open (per layer shape, per projection and token count):
//! the caller makes one [`moe::MoeWorkspace`] per stream, then launches the whole layer (align,
//! gate_up with SiLU(gate) * up, down, the router-weighted sum) or its steps on its own stream.
//! The kernel of each step is the entry whose token count B is nearest in log scale. Scratch
//! lives in the workspace, never shared between streams. The C ABI is `fp4tune_moe_*`.

pub mod composite;
mod dispatcher;
mod error;
pub mod moe;
mod plan;

#[cfg(test)]
mod gpu_tests;

pub use dispatcher::{Dispatcher, GemmArgs, Options, Route, RouteKind, StartupReport};
pub use error::RuntimeError;
pub use plan::{Plan, PlannedKernel};
