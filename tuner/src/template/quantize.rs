//! The GPU activation quantizer (`templates/common/quantize.cuh`): rendering for an [`Arch`], its
//! launch shape and argument block, and a bit-exactness check against the CPU quantizer.
//!
//! The kernel turns bf16 activations `[M, K]` into NVFP4 codes `[M, K/2]` and swizzled UE4M3
//! scales with a static input scale, bit for bit like
//! [`crate::format::quantize_activations`] followed by [`crate::format::Nvfp4Matrix::scales_swizzled`].

use super::{Arch, KernelSource, LaunchDims};
use crate::compile::CompiledKernel;
use crate::format::{self, FormatError};
use crate::gpu::{Gpu, GpuError};
use half::bf16;

/// The `extern "C"` symbol of the quantizer.
pub const QUANTIZE_KERNEL: &str = "fp4tune_quantize_bf16_nvfp4";
/// Threads per CTA (one thread per 16-element block).
pub const QUANTIZE_THREADS: u32 = 256;

/// Errors of rendering, launching or checking the quantizer.
#[derive(Debug, thiserror::Error)]
pub enum QuantizeError {
    #[error("rendering {QUANTIZE_KERNEL}: {0}")]
    Render(String),
    #[error("{QUANTIZE_KERNEL}: {0}")]
    Shape(String),
    #[error(transparent)]
    Format(#[from] FormatError),
    #[error(transparent)]
    Gpu(#[from] GpuError),
    #[error("{QUANTIZE_KERNEL} differs from the CPU quantizer (M={m}, K={k}): {detail}")]
    Mismatch { m: usize, k: usize, detail: String },
}

pub use crate::gpu::params::QuantizeParams;

/// Render the quantizer for `arch` (the kernel needs sm_80+; both our targets qualify).
pub fn render(arch: Arch) -> Result<KernelSource, QuantizeError> {
    let unit = format!(
        "#include \"common/quantize.cuh\"\n\
         extern \"C\" __global__ void __launch_bounds__({t}) {QUANTIZE_KERNEL}(const fp4tune::QuantizeParams p) {{\n\
         \x20   fp4tune::quantize_bf16_nvfp4<{t}>(p);\n\
         }}\n",
        t = QUANTIZE_THREADS
    );
    KernelSource::from_unit(QUANTIZE_KERNEL.to_string(), arch, &unit).map_err(QuantizeError::Render)
}

fn check_shape(m: usize, k: usize) -> Result<(), QuantizeError> {
    if k % 16 != 0 || k == 0 || m == 0 {
        return Err(QuantizeError::Shape(format!(
            "M = {m}, K = {k}: need M > 0 and K a positive multiple of 16"
        )));
    }
    if m > i32::MAX as usize || k > i32::MAX as usize {
        return Err(QuantizeError::Shape(format!("M = {m}, K = {k} overflow the int fields")));
    }
    Ok(())
}

/// Bytes of the codes buffer: `M * K / 2`.
pub fn codes_bytes(m: usize, k: usize) -> usize {
    m * k / 2
}

/// Bytes of the swizzled scale buffer: `round_up(M, 128) * round_up(K/16, 4)`.
pub fn sf_bytes(m: usize, k: usize) -> usize {
    format::swizzled_len(m, k / 16)
}

/// One thread per entry of the padded scale matrix, [`QUANTIZE_THREADS`] per CTA, no shared
/// memory.
pub fn launch_dims(m: usize, k: usize) -> Result<LaunchDims, QuantizeError> {
    check_shape(m, k)?;
    let threads = sf_bytes(m, k) as u64;
    let blocks = threads.div_ceil(QUANTIZE_THREADS as u64);
    let grid = u32::try_from(blocks)
        .map_err(|_| QuantizeError::Shape(format!("M = {m}, K = {k}: {blocks} CTAs")))?;
    Ok(LaunchDims { grid: (grid, 1, 1), block: (QUANTIZE_THREADS, 1, 1), smem_bytes: 0 })
}

/// A bf16 test input exercising every path of the quantizer, and a power-of-two input scale
/// (2^-7) so that exact E2M1 ties occur. Per 16-block, by block index mod 8: random; zeros;
/// tiny values whose scale rounds to 0; huge values whose scale saturates at 448; exact ties;
/// inf, -inf and NaN among normal values; f32-subnormal values; a wide dynamic range.
pub fn quantizer_test_input(m: usize, k: usize, seed: u64) -> (Vec<bf16>, f32) {
    use rand::{rngs::StdRng, Rng, SeedableRng};
    let mut rng = StdRng::seed_from_u64(seed);
    let input_scale = 1.0 / 128.0;
    // amax 3 -> scale 3 / 6 / 2^-7 = 64 exactly, d = 0.5: these are the E2M1 ties times d.
    let ties = [3.0f32, 0.125, 0.375, 0.625, 0.875, 1.25, 1.75, 2.5];
    let mut x = Vec::with_capacity(m * k);
    for r in 0..m {
        for c in 0..k {
            let (b, j) = ((r * k + c) / 16, c % 16);
            let sign = if rng.random_range(0..2) == 0 { 1.0 } else { -1.0 };
            let v = match b % 8 {
                0 => rng.random_range(-4.0f32..4.0),
                1 => 0.0,
                2 => rng.random_range(-1e-6f32..1e-6),
                3 => rng.random_range(-200.0f32..200.0),
                4 => ties[j % 8] * if j == 0 { 1.0 } else { sign },
                5 => match j {
                    3 => f32::INFINITY,
                    7 => f32::NEG_INFINITY,
                    11 => f32::NAN,
                    _ => rng.random_range(-4.0f32..4.0),
                },
                6 => sign * rng.random_range(1e-40f32..1e-38),
                _ => sign * 2f32.powi(rng.random_range(-30..12)) * rng.random_range(1.0f32..2.0),
            };
            x.push(bf16::from_f32(v));
        }
    }
    (x, input_scale)
}

/// What [`check_quantizer_bit_exact`] compared.
#[derive(Debug, Clone, PartialEq)]
pub struct QuantizerCheck {
    pub m: usize,
    pub k: usize,
    pub code_bytes: usize,
    pub sf_bytes: usize,
}

/// Run the compiled quantizer on [`quantizer_test_input`] and compare codes and swizzled scales
/// (padding included) byte for byte with the CPU quantizer. The output buffers are pre-filled
/// with 0xAA so that a byte the kernel does not write is caught. `kernel` is [`render`]'s source
/// compiled for the device's arch.
pub fn check_quantizer_bit_exact(
    gpu: &Gpu,
    kernel: &CompiledKernel,
    m: usize,
    k: usize,
    seed: u64,
) -> Result<QuantizerCheck, QuantizeError> {
    let dims = launch_dims(m, k)?;
    let (x, input_scale) = quantizer_test_input(m, k, seed);
    let cpu = format::quantize_activations(&x, m, k, input_scale)?;
    let cpu_sf = cpu.scales_swizzled();

    let x_bits: Vec<u16> = x.iter().map(|v| v.to_bits()).collect();
    let d_x = gpu.upload(&x_bits)?;
    let d_codes = gpu.upload(&vec![0xAAu8; codes_bytes(m, k)])?;
    let d_sf = gpu.upload(&vec![0xAAu8; sf_bytes(m, k)])?;
    let params = QuantizeParams {
        x: d_x.ptr(),
        codes: d_codes.ptr(),
        sf: d_sf.ptr(),
        m: m as i32,
        k: k as i32,
        input_scale,
    };
    let f = gpu.load(kernel, 0)?;
    // SAFETY: the buffers hold M*K bf16, M*K/2 code bytes and sf_bytes(M, K) scale bytes, as
    // quantize.cuh requires for these dims, and live until after the synchronize below.
    unsafe { gpu.launch(&f, dims, &params)? };
    gpu.synchronize()?;
    let codes = gpu.download(&d_codes)?;
    let sf = gpu.download(&d_sf)?;

    let mismatch = |detail: String| QuantizeError::Mismatch { m, k, detail };
    if let Some(i) = (0..sf.len()).find(|&i| sf[i] != cpu_sf[i]) {
        let bad = (0..sf.len()).filter(|&i| sf[i] != cpu_sf[i]).count();
        return Err(mismatch(format!(
            "{bad} of {} swizzled scale bytes differ; first at byte {i}: GPU {:#04x}, CPU {:#04x}",
            sf.len(),
            sf[i],
            cpu_sf[i]
        )));
    }
    if let Some(i) = (0..codes.len()).find(|&i| codes[i] != cpu.codes[i]) {
        let bad = (0..codes.len()).filter(|&i| codes[i] != cpu.codes[i]).count();
        let (r, c) = (i / (k / 2), 2 * (i % (k / 2)));
        return Err(mismatch(format!(
            "{bad} of {} code bytes differ; first at row {r}, elements {c}..{}: GPU {:#04x}, \
             CPU {:#04x} (inputs {} {})",
            codes.len(),
            c + 1,
            codes[i],
            cpu.codes[i],
            x[r * k + c],
            x[r * k + c + 1]
        )));
    }
    Ok(QuantizerCheck { m, k, code_bytes: codes.len(), sf_bytes: sf.len() })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compile::Compiler;

    #[test]
    fn params_layout_matches_the_c_struct() {
        assert_eq!(std::mem::size_of::<QuantizeParams>(), 40);
        assert_eq!(std::mem::align_of::<QuantizeParams>(), 8);
        assert_eq!(std::mem::offset_of!(QuantizeParams, sf), 16);
        assert_eq!(std::mem::offset_of!(QuantizeParams, m), 24);
        assert_eq!(std::mem::offset_of!(QuantizeParams, input_scale), 32);
    }

    #[test]
    fn launch_covers_the_padded_scale_matrix() {
        let d = launch_dims(1, 16).unwrap();
        assert_eq!((d.grid, d.block, d.smem_bytes), ((2, 1, 1), (256, 1, 1), 0));
        // 300 rows -> 384, K/16 = 6 -> 8: 3072 threads.
        assert_eq!(launch_dims(300, 96).unwrap().grid.0, 12);
        assert_eq!(sf_bytes(300, 96), 3072);
        assert_eq!(codes_bytes(300, 96), 300 * 48);
        assert!(launch_dims(4, 24).is_err());
        assert!(launch_dims(0, 16).is_err());
    }

    #[test]
    fn renders_self_contained_source() {
        let src = render(Arch::Sm90a).unwrap();
        assert_eq!(src.kernel_name, QUANTIZE_KERNEL);
        assert!(!src.code.contains("#include"));
        assert!(src.code.contains("quantize_bf16_nvfp4<256>"));
        assert!(src.options.iter().all(|o| !o.contains("fast-math") && !o.contains("fast_math")));
    }

    /// NVRTC is a hard requirement of the test suite (like compile::tests).
    #[test]
    fn compiles_for_both_archs_without_spills() {
        let dir = tempfile::tempdir().unwrap();
        let c = Compiler::new(Some(dir.path().to_path_buf())).unwrap_or_else(|e| panic!("{e}"));
        for arch in [Arch::Sm90a, Arch::Sm120a] {
            let k = c.compile(&render(arch).unwrap()).unwrap_or_else(|e| panic!("{e}"));
            let s = k.stats.unwrap_or_else(|| {
                panic!("no ptxas statistics in the NVRTC log ({:?}):\n{}", k.origin, k.log)
            });
            assert!(!s.spills(), "{arch}: {s:?}");
        }
    }

    #[test]
    fn test_input_hits_the_special_paths() {
        let (x, is) = quantizer_test_input(2, 256, 1);
        let q = format::quantize_activations(&x, 2, 256, is).unwrap();
        assert!(q.scales.contains(&0x7e), "a saturated scale");
        assert!(q.scales.contains(&0x00), "a zero scale");
        assert!(x.iter().any(|v| v.is_nan()) && x.iter().any(|v| v.is_infinite()));
        // Block 4 holds exact ties with scale 64 (0x68) and d = 0.5.
        assert_eq!(q.scales[4], 0x68);
        let codes: Vec<u8> = format::unpack_nibbles(&q.codes[32..40]);
        let mags: Vec<u8> = codes.iter().map(|c| c & 7).collect();
        assert_eq!(&mags[..8], &[7, 0, 2, 2, 4, 4, 6, 6]);
    }

    #[cfg(feature = "gpu")]
    #[test]
    fn gpu_quantizer_is_bit_exact() {
        let gpu = Gpu::open(0).unwrap_or_else(|e| panic!("{e}"));
        let (major, minor) = gpu.info().compute_capability;
        let arch = Arch::for_compute_capability(major, minor).expect("an sm_90 or sm_120 device");
        let c = Compiler::new(None).unwrap_or_else(|e| panic!("{e}"));
        let k = c.compile(&render(arch).unwrap()).unwrap_or_else(|e| panic!("{e}"));
        for (m, kk, seed) in [(1, 16, 1), (130, 80, 2), (256, 4096, 3), (1000, 6144, 4)] {
            check_quantizer_bit_exact(&gpu, &k, m, kk, seed).unwrap_or_else(|e| panic!("{e}"));
        }
    }
}
