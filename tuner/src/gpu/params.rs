//! Kernel parameter blocks mirrored from the templates: `GemmParams` (templates/common/params.cuh)
//! and `QuantizeParams` (templates/common/quantize.cuh).

use cudarc::driver::DeviceRepr;

/// Field for field the C struct `fp4tune::GemmParams` (pointers as 64-bit device addresses).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct GemmParams {
    pub a: u64,
    pub a_sf: u64,
    pub w: u64,
    pub w_sf: u64,
    pub y: u64,
    pub workspace: u64,
    pub counters: u64,
    pub m: i32,
    pub n: i32,
    pub k: i32,
    pub alpha: f32,
}

// SAFETY: plain-old-data with the same layout as the C struct (7 pointers, 3 ints, 1 float;
// 72 bytes, 8-byte aligned), passed by value as the single kernel argument.
unsafe impl DeviceRepr for GemmParams {}

/// Field for field the C struct `fp4tune::QuantizeParams` in quantize.cuh (pointers as 64-bit
/// device addresses): 3 pointers, 2 ints, 1 float = 36 bytes, padded to 40, 8-byte aligned.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct QuantizeParams {
    /// bf16 `[M, K]`, 16-byte aligned.
    pub x: u64,
    /// `[M, K/2]` bytes, 8-byte aligned.
    pub codes: u64,
    /// `template::quantize::sf_bytes` bytes (swizzled, padding written as 0).
    pub sf: u64,
    pub m: i32,
    pub k: i32,
    pub input_scale: f32,
}

// SAFETY: plain-old-data with the layout of the C struct (checked by a test), passed by value as
// the single kernel argument.
unsafe impl DeviceRepr for QuantizeParams {}

#[cfg(test)]
mod tests {
    #[test]
    fn layout_matches_the_c_struct() {
        assert_eq!(std::mem::size_of::<super::GemmParams>(), 72);
        assert_eq!(std::mem::align_of::<super::GemmParams>(), 8);
        assert_eq!(std::mem::offset_of!(super::GemmParams, m), 56);
        assert_eq!(std::mem::offset_of!(super::GemmParams, alpha), 68);
    }
}
