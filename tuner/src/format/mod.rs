//! The NVFP4 data format on the CPU: E2M1/E4M3 codecs, quantization, nibble packing, the swizzled
//! scale layout and the reference GEMM every GPU kernel is checked against.

pub mod e2m1;
pub mod e4m3;
pub mod pack;
pub mod quant;
pub mod reference;
pub mod swizzle;

pub use e2m1::{e2m1_decode, e2m1_encode, E2M1_MAX};
pub use e4m3::{e4m3_decode, e4m3_encode, E4M3_MAX, E4M3_MIN_SUBNORMAL};
pub use pack::{nibble_at, pack_nibbles, unpack_nibbles};
pub use quant::{
    quantize_activation_block, quantize_activations, quantize_weight, quantize_weight_bf16,
    weight_global_scale, Nvfp4Matrix, BLOCK,
};
pub use reference::{gemm_nt_f32, reference_gemm, GemmA, ReferenceOutput};
pub use swizzle::{
    fill_padding_columns, padded_rows, padded_scale_cols, swizzle_scales, swizzled_len,
    swizzled_offset, unswizzle_scales, PADDING_SCALE,
};

/// Errors of the format module; each names the tensor and the problem.
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    #[error("{what}: K = {k} is not a multiple of 16 (NVFP4 blocks are 16 wide; pad K first)")]
    KNotMultipleOf16 { what: String, k: usize },
    #[error("{what}: {problem}")]
    Shape { what: String, problem: String },
    #[error("{what}: non-finite value {value} at index {index}")]
    NonFinite { what: String, index: usize, value: f32 },
    #[error("input scale {value} is not a positive finite number")]
    BadInputScale { value: f32 },
}
