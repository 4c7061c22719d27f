//! Parameter blocks of the grouped MoE kernels, mirrored field for field from
//! templates/moe/params.cuh (pointers as 64-bit device addresses).

use cudarc::driver::DeviceRepr;

/// `fp4tune::moe::AlignParams`: 6 pointers, 5 ints (68 bytes, padded to 72).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct MoeAlignParams {
    pub topk_ids: u64,
    pub offsets: u64,
    pub sorted_ids: u64,
    pub inverse: u64,
    pub tiles: u64,
    pub tile_count: u64,
    pub tokens: i32,
    pub top_k: i32,
    pub expert_begin: i32,
    pub experts: i32,
    pub max_tiles: i32,
}

// SAFETY: plain-old-data with the layout of the C struct (checked by a test), passed by value as
// the single kernel argument.
unsafe impl DeviceRepr for MoeAlignParams {}

/// `fp4tune::moe::AlignChunkParams` (templates/moe/align.cuh): the routing parameters and the
/// chunked form's per (chunk, expert) row counts (80 bytes; the instantiation's static_assert
/// checks both sides).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct MoeAlignChunkParams {
    pub align: MoeAlignParams,
    pub base: u64,
}

// SAFETY: as MoeAlignParams.
unsafe impl DeviceRepr for MoeAlignChunkParams {}

/// `fp4tune::moe::AlignQuantizeParams` (templates/moe/align.cuh): the one-CTA routing
/// parameters, the quantizer's parameters for X and how many CTAs quantize (CTA `quant_ctas`
/// routes); 116 bytes, padded to 120 (the instantiation's static_assert checks the size and
/// where `quant` starts).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct MoeAlignQuantizeParams {
    pub align: MoeAlignParams,
    pub quant: super::params::QuantizeParams,
    pub quant_ctas: i32,
}

// SAFETY: as MoeAlignParams.
unsafe impl DeviceRepr for MoeAlignQuantizeParams {}

/// `fp4tune::moe::GroupedParams`: 11 pointers, 1 float, 3 ints (104 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct MoeGroupedParams {
    pub a: u64,
    pub a_sf: u64,
    pub w: u64,
    pub w_sf: u64,
    pub alpha: u64,
    pub y: u64,
    pub sorted_ids: u64,
    pub tiles: u64,
    pub tile_count: u64,
    /// W4A4 gate_up: H as NVFP4 codes and swizzled scales, and H's input scale.
    pub h_codes: u64,
    pub h_sf: u64,
    pub h_scale: f32,
    pub n: i32,
    pub k: i32,
    pub top_k: i32,
}

// SAFETY: as MoeAlignParams.
unsafe impl DeviceRepr for MoeGroupedParams {}

/// `fp4tune::moe::GroupedSm120Params` (templates/moe/sm120.cuh): the grouped parameters and the
/// split-K workspace of the sm120 grouped kernels (120 bytes, padded to 128; the instantiation's
/// static_assert checks the grouped block's size, where `partials` starts, and the whole size).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct MoeGroupedSm120Params {
    pub grouped: MoeGroupedParams,
    /// fp32 partials `[split_tiles][n-tiles][split_k][block_n * block_m]`.
    pub partials: u64,
    /// Arrival counters `[split_tiles][n-tiles]`, zero between launches.
    pub counters: u64,
    /// Tiles the partials hold (`moe::sm120::split_tiles`); 0 without split-K.
    pub split_tiles: i32,
}

// SAFETY: as MoeAlignParams.
unsafe impl DeviceRepr for MoeGroupedSm120Params {}

/// `fp4tune::moe::FinalizeParams`: 4 pointers, 3 ints (44 bytes, padded to 48).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct MoeFinalizeParams {
    pub rows: u64,
    pub weights: u64,
    pub inverse: u64,
    pub y: u64,
    pub tokens: i32,
    pub top_k: i32,
    pub n: i32,
}

// SAFETY: as MoeAlignParams.
unsafe impl DeviceRepr for MoeFinalizeParams {}

/// templates/moe/order.cuh `OrderParams`: experts of one projection's weight codes, read from
/// `src` (a copy) and written to `dst` in the other layout.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct MoeOrderParams {
    pub src: u64,
    pub dst: u64,
    pub n: i32,
    pub k: i32,
    pub op: i32,
}

// SAFETY: as MoeAlignParams.
unsafe impl DeviceRepr for MoeOrderParams {}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{align_of, offset_of, size_of};

    #[test]
    fn layouts_match_the_c_structs() {
        assert_eq!((size_of::<MoeAlignParams>(), align_of::<MoeAlignParams>()), (72, 8));
        assert_eq!(offset_of!(MoeAlignParams, tokens), 48);
        assert_eq!(offset_of!(MoeAlignParams, max_tiles), 64);
        assert_eq!((size_of::<MoeAlignChunkParams>(), align_of::<MoeAlignChunkParams>()), (80, 8));
        assert_eq!(offset_of!(MoeAlignChunkParams, base), 72);
        assert_eq!(
            (size_of::<MoeAlignQuantizeParams>(), align_of::<MoeAlignQuantizeParams>()),
            (120, 8)
        );
        assert_eq!(offset_of!(MoeAlignQuantizeParams, quant), 72);
        assert_eq!(offset_of!(MoeAlignQuantizeParams, quant_ctas), 112);
        assert_eq!((size_of::<MoeGroupedParams>(), align_of::<MoeGroupedParams>()), (104, 8));
        assert_eq!(offset_of!(MoeGroupedParams, h_codes), 72);
        assert_eq!(offset_of!(MoeGroupedParams, h_scale), 88);
        assert_eq!(offset_of!(MoeGroupedParams, n), 92);
        assert_eq!(offset_of!(MoeGroupedParams, top_k), 100);
        assert_eq!(
            (size_of::<MoeGroupedSm120Params>(), align_of::<MoeGroupedSm120Params>()),
            (128, 8)
        );
        assert_eq!(offset_of!(MoeGroupedSm120Params, partials), 104);
        assert_eq!(offset_of!(MoeGroupedSm120Params, split_tiles), 120);
        assert_eq!((size_of::<MoeFinalizeParams>(), align_of::<MoeFinalizeParams>()), (48, 8));
        assert_eq!(offset_of!(MoeFinalizeParams, tokens), 32);
        assert_eq!((size_of::<MoeOrderParams>(), align_of::<MoeOrderParams>()), (32, 8));
        assert_eq!(offset_of!(MoeOrderParams, op), 24);
    }
}
