//! The SM90 family (H100 / H200): NVFP4 dequantized exactly to bf16 in registers, bf16 `mma.sync` m16n8k16.
//!
//! This module owns the Rust half of `templates/sm90/`: the constraints of a configuration (the same
//! limits the template's `Sm90Config` asserts), its shared-memory size, the instantiation unit, the
//! search space and a generic default. It also mirrors the template's index maps (the K permutation
//! of the MMA fragments and the shared-memory swizzles) so that they can be tested without a GPU.
//!
//! Four weight pipelines ([`Pipeline`]): `CpAsync` (`gemm.cuh`, `Sm90Config`, any M) and the three
//! streamed ones of `direct.cuh` (`DirectConfig`, swap-AB, decode-sized M): `Registers` (a per-warp
//! register ring, `stages` = ring depth 1..8), `WarpRing` (the warp ring: a per-warp ring in
//! shared memory, 2..16 deep) and `Global` (the register ring holds the activations too). For `Registers` and
//! `WarpRing`, `block_k` is the activation slice a CTA keeps in shared memory per pass (one pass
//! when `block_k = K / split_k`); for `Global` it only orders the chunks. Split-K <= 8 is reduced
//! with one cluster barrier into rank 0 (workspace + counters above 8, as for `CpAsync`), and
//! `min_ctas` compiles a streamed kernel for that many CTAs per SM.
//!
//! Launch contract (see `templates/sm90/gemm.cuh`): grid `(ceil(N/block_n), ceil(M/block_m),
//! split_k)`, `threads()` threads, `smem_bytes()` of dynamic shared memory (opt-in above 48 KiB);
//! with `split_k > 1` a workspace of `split_k*M*N` floats and one zeroed u32 counter per output tile
//! (index `m_tile * n_tiles + n_tile`), left zeroed by the kernel.

mod instantiate;
mod layout;
mod limits;
mod seeds;
mod space;

pub use instantiate::*;
pub use layout::*;
pub use limits::*;
pub use seeds::*;
pub use space::*;

#[cfg(test)]
mod direct_tests;
#[cfg(test)]
mod nvrtc_tests;
#[cfg(test)]
mod tests;
