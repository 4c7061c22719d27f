//! Scratch memory of GEMM launches: the split-K partial sums and tile counters, the bf16
//! expansion of the dequantize-then-cuBLAS method and cuBLAS's own workspace, in one device
//! buffer per [`GemmWorkspace`].
//!
//! A workspace belongs to one stream at a time: launches on different streams that may run at the
//! same time each pass their own ([`super::Dispatcher::gemm_in`], `fp4tune_gemm_ws` in C), so two
//! micro-batches on two streams never share scratch. It is sized when it is created for every
//! route of the table up to a largest M ([`super::Plan::scratch`]); a launch allocates and
//! synchronizes nothing, and one that needs more than the workspace holds is refused
//! ([`RuntimeError::WorkspaceTooSmall`]) before anything is enqueued.

use super::error::RuntimeError;
use crate::gpu::{DeviceBuf, Gpu};
use crate::problem::GemmProblem;
use crate::table::Method;
use crate::template::GemmConfig;
use std::fmt;

/// Bytes of cuBLAS workspace a workspace gives the dequantize-then-cuBLAS method: the size
/// NVIDIA's cuBLAS documentation recommends on Hopper (4 MiB on earlier GPUs; more is harmless).
/// Passing it explicitly keeps cuBLAS's scratch per stream as well and spares cuBLAS an
/// allocation of its own while a stream is being captured.
pub const BLAS_WORKSPACE_BYTES: usize = 32 << 20;

/// Every region starts on this boundary (cuBLAS wants 256-byte aligned workspaces).
const REGION_ALIGN: usize = 256;

/// How much scratch of each kind a launch needs or a workspace holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ScratchSizes {
    /// Split-K partial sums, f32 elements.
    pub split_k_floats: usize,
    /// Split-K tile counters, u32 words (zero between launches: the kernels leave them zeroed).
    pub counter_words: usize,
    /// bf16 elements of the dequantize-then-cuBLAS expansion: W, then A when it is NVFP4.
    pub composite_elems: usize,
    /// Bytes of cuBLAS workspace for the dequantize-then-cuBLAS method.
    pub blas_bytes: usize,
}

impl ScratchSizes {
    /// What one launch of `config` (or of the composite method) on `p` needs.
    pub fn of_launch(config: &GemmConfig, p: &GemmProblem, method: Method) -> Self {
        match method {
            Method::DequantCublasBf16 => ScratchSizes {
                composite_elems: super::composite::workspace_elems(p),
                blas_bytes: BLAS_WORKSPACE_BYTES,
                ..Self::default()
            },
            Method::Fused => ScratchSizes {
                split_k_floats: config.workspace_floats(p),
                counter_words: config.counter_words(p),
                ..Self::default()
            },
        }
    }

    /// The larger of each kind.
    pub fn max(self, o: Self) -> Self {
        ScratchSizes {
            split_k_floats: self.split_k_floats.max(o.split_k_floats),
            counter_words: self.counter_words.max(o.counter_words),
            composite_elems: self.composite_elems.max(o.composite_elems),
            blas_bytes: self.blas_bytes.max(o.blas_bytes),
        }
    }

    /// Whether every kind holds at least what `need` asks for.
    pub fn covers(&self, need: &Self) -> bool {
        self.split_k_floats >= need.split_k_floats
            && self.counter_words >= need.counter_words
            && self.composite_elems >= need.composite_elems
            && self.blas_bytes >= need.blas_bytes
    }

    /// Nothing at all (a launch without split-K on the fused path).
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    /// The capacity a workspace that holds `self` grows to for `need`: every kind that is short
    /// at least doubles (so a run of growing M reallocates a logarithmic number of times).
    pub fn grown_for(&self, need: &Self) -> Self {
        let grow = |have: usize, want: usize| if want > have { want.max(have * 2) } else { have };
        ScratchSizes {
            split_k_floats: grow(self.split_k_floats, need.split_k_floats),
            counter_words: grow(self.counter_words, need.counter_words),
            composite_elems: grow(self.composite_elems, need.composite_elems),
            blas_bytes: grow(self.blas_bytes, need.blas_bytes),
        }
    }

    /// Bytes of the device buffer that holds these sizes ([`Layout`]).
    pub fn bytes(&self) -> usize {
        Layout::new(self).bytes
    }
}

impl fmt::Display for ScratchSizes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "split-K {} f32 + {} counters, dequantize-then-cuBLAS {} bf16 + {} bytes of cuBLAS workspace",
            self.split_k_floats, self.counter_words, self.composite_elems, self.blas_bytes
        )
    }
}

/// Byte offsets of the regions in a workspace's buffer, each [`REGION_ALIGN`]-aligned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    pub split_k: usize,
    pub counters: usize,
    pub composite: usize,
    pub blas: usize,
    pub bytes: usize,
}

impl Layout {
    pub fn new(s: &ScratchSizes) -> Self {
        let mut at = 0usize;
        let mut region = |bytes: usize| {
            let start = at;
            at = (at + bytes).div_ceil(REGION_ALIGN) * REGION_ALIGN;
            start
        };
        let split_k = region(s.split_k_floats * 4);
        let counters = region(s.counter_words * 4);
        let composite = region(s.composite_elems * 2);
        let blas = region(s.blas_bytes);
        Layout { split_k, counters, composite, blas, bytes: at }
    }
}

/// Refuse a launch whose needs the workspace does not cover, naming what is missing.
pub(crate) fn check_capacity(
    have: &ScratchSizes,
    max_m: u32,
    need: &ScratchSizes,
    p: &GemmProblem,
) -> Result<(), RuntimeError> {
    if have.covers(need) {
        return Ok(());
    }
    Err(RuntimeError::WorkspaceTooSmall {
        problem: p.to_string(),
        needed: need.to_string(),
        have: have.to_string(),
        max_m,
    })
}

/// Scratch memory for one stream's GEMM launches through one dispatcher, sized at creation
/// ([`super::Dispatcher::gemm_workspace`]). `Send + Sync`; use it from one stream at a time and
/// drop it only after the launches that use it completed.
#[derive(Debug)]
pub struct GemmWorkspace {
    /// The dispatcher that created it (its sizes follow that dispatcher's table and device).
    pub(super) owner: u64,
    max_m: u32,
    capacity: ScratchSizes,
    layout: Layout,
    /// Zeroed at creation (the split-K counters must start at zero).
    buf: DeviceBuf<u8>,
}

impl GemmWorkspace {
    /// Allocate a zeroed workspace of `capacity` on `gpu` and wait for the allocation (it is used
    /// on other streams right after).
    pub(super) fn new(
        gpu: &Gpu,
        owner: u64,
        max_m: u32,
        capacity: ScratchSizes,
    ) -> Result<Self, RuntimeError> {
        let layout = Layout::new(&capacity);
        let buf = gpu.alloc_zeros::<u8>(layout.bytes)?;
        gpu.synchronize()?;
        Ok(Self { owner, max_m, capacity, layout, buf })
    }

    /// The largest M it was sized for (larger M of split-K or dequantize-then-cuBLAS routes may
    /// not fit; other routes need no scratch at any M).
    pub fn max_m(&self) -> u32 {
        self.max_m
    }

    /// What it holds.
    pub fn capacity(&self) -> ScratchSizes {
        self.capacity
    }

    /// Device bytes it occupies.
    pub fn bytes(&self) -> usize {
        self.buf.bytes()
    }

    /// Device addresses of the split-K partial sums and the tile counters.
    pub(super) fn split_k(&self) -> (u64, u64) {
        (self.buf.ptr() + self.layout.split_k as u64, self.buf.ptr() + self.layout.counters as u64)
    }

    /// Device address of the bf16 expansion of the dequantize-then-cuBLAS method.
    pub(super) fn composite(&self) -> u64 {
        self.buf.ptr() + self.layout.composite as u64
    }

    /// Device address and size of cuBLAS's workspace.
    pub(super) fn blas(&self) -> (u64, usize) {
        (self.buf.ptr() + self.layout.blas as u64, self.capacity.blas_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::problem::AType;
    use crate::template::{default_config, Family};

    fn split(k: u32) -> GemmConfig {
        GemmConfig { split_k: k, ..default_config(Family::Sm90, AType::Bf16) }
    }

    #[test]
    fn a_launch_needs_split_k_scratch_or_the_composite_expansion_never_both() {
        let p = GemmProblem::new(16, 512, 6144, AType::Bf16);
        let c = split(4);
        let fused = ScratchSizes::of_launch(&c, &p, Method::Fused);
        assert_eq!(fused.split_k_floats, 4 * 16 * 512);
        assert_eq!(fused.counter_words, c.counter_words(&p));
        assert_eq!((fused.composite_elems, fused.blas_bytes), (0, 0));
        assert!(ScratchSizes::of_launch(&split(1), &p, Method::Fused).is_empty());
        let composite = ScratchSizes::of_launch(&c, &p, Method::DequantCublasBf16);
        assert_eq!((composite.split_k_floats, composite.counter_words), (0, 0));
        assert_eq!(composite.composite_elems, 512 * 6144);
        assert_eq!(composite.blas_bytes, BLAS_WORKSPACE_BYTES);
        let w4a4 = GemmProblem::new(16, 512, 6144, AType::Nvfp4);
        let composite = ScratchSizes::of_launch(&c, &w4a4, Method::DequantCublasBf16);
        assert_eq!(composite.composite_elems, 512 * 6144 + 16 * 6144);
    }

    #[test]
    fn regions_are_aligned_disjoint_and_hold_their_sizes() {
        let s = ScratchSizes {
            split_k_floats: 3,
            counter_words: 5,
            composite_elems: 7,
            blas_bytes: BLAS_WORKSPACE_BYTES,
        };
        let l = Layout::new(&s);
        let regions = [
            (l.split_k, s.split_k_floats * 4),
            (l.counters, s.counter_words * 4),
            (l.composite, s.composite_elems * 2),
            (l.blas, s.blas_bytes),
        ];
        for w in regions.windows(2) {
            assert!(w[0].0 + w[0].1 <= w[1].0, "{regions:?}");
        }
        assert!(regions.iter().all(|(o, _)| o % REGION_ALIGN == 0), "{regions:?}");
        assert_eq!(l.bytes, 3 * 256 + BLAS_WORKSPACE_BYTES);
        assert_eq!(s.bytes(), l.bytes);
        // Empty kinds take no room.
        assert_eq!(ScratchSizes::default().bytes(), 0);
        let only_counters = ScratchSizes { counter_words: 64, ..ScratchSizes::default() };
        assert_eq!(Layout::new(&only_counters).counters, 0);
        assert_eq!(only_counters.bytes(), 256);
    }

    #[test]
    fn capacity_covers_every_kind_and_grows_by_doubling() {
        let have = ScratchSizes {
            split_k_floats: 100,
            counter_words: 10,
            composite_elems: 0,
            blas_bytes: 0,
        };
        let need = ScratchSizes { split_k_floats: 120, counter_words: 4, ..have };
        assert!(!have.covers(&need));
        assert!(have.covers(&ScratchSizes { split_k_floats: 100, ..need }));
        assert!(have.covers(&ScratchSizes::default()));
        let grown = have.grown_for(&need);
        assert_eq!(grown.split_k_floats, 200, "a short kind at least doubles");
        assert_eq!(grown.counter_words, 10, "a kind that suffices stays");
        assert!(grown.covers(&need));
        let big = ScratchSizes { split_k_floats: 1000, ..need };
        assert_eq!(have.grown_for(&big).split_k_floats, 1000, "or grows to the need");
        assert_eq!(have.max(big).split_k_floats, 1000);
        assert_eq!(have.max(big).counter_words, 10);
    }

    #[test]
    fn a_launch_the_workspace_cannot_hold_is_refused_naming_sizes_and_max_m() {
        let p = GemmProblem::new(200, 512, 6144, AType::Bf16);
        let need = ScratchSizes::of_launch(&split(4), &p, Method::Fused);
        let have = ScratchSizes { split_k_floats: 4 * 16 * 512, counter_words: 64, ..need };
        assert!(check_capacity(&need, 200, &need, &p).is_ok());
        let e = check_capacity(&have, 16, &need, &p).unwrap_err();
        assert!(matches!(e, RuntimeError::WorkspaceTooSmall { .. }), "{e:?}");
        let e = e.to_string();
        for want in ["M=200", "max_m 16", &format!("split-K {} f32", 4 * 200 * 512)] {
            assert!(e.contains(want), "want {want:?} in {e}");
        }
    }

    #[test]
    fn workspace_is_send_and_sync() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<GemmWorkspace>();
    }
}
