//! `GemmParams`: the Rust mirror of the kernel parameter block in templates/common/params.cuh.

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
