//! What the MMA probes share: a generated one-warp kernel, its input, the CPU model's expected
//! outputs, and how a probe is run on the GPU (outputs compared bit for bit) or, without a GPU,
//! compiled and its SASS read for the tensor-core instruction it must contain.
//!
//! A probe kernel takes `(const uint8_t* in, float* out, u64 args...)`, runs as one warp of 32
//! lanes and writes 4 floats per lane and run: `out[(run * 32 + lane) * 4 + reg]`.

use super::{one_line, CheckResult};
use crate::compile::sass::{self, SassError};
use crate::compile::Compiler;
use crate::gpu::{Gpu, GpuError, LaunchDims};
use crate::template::{Family, KernelSource};

/// The nonzero E2M1 codes (both signs, every magnitude but 0).
pub const NONZERO_E2M1: [u8; 14] = [1, 2, 3, 4, 5, 6, 7, 9, 10, 11, 12, 13, 14, 15];

/// UE4M3 bits of 2^e for e in -9..=8 (subnormals 2^-9..2^-7, normals 2^-6..2^8).
pub fn ue4m3_pow2(e: i32) -> u8 {
    match e {
        -9 => 0x01,
        -8 => 0x02,
        -7 => 0x04,
        -6..=8 => ((e + 7) as u8) << 3,
        _ => panic!("2^{e} is not a UE4M3 power of two used by the probes"),
    }
}

/// Exponent of a power-of-two scale in -9..=8: distinct over `row` (< 18 values) for one
/// `offset`, and distinct over offsets that differ mod 18 for one row.
pub fn exponent(row: u32, offset: u32) -> i32 {
    ((row + offset) % 18) as i32 - 9
}

/// What one run of a probe is, in words (for the first mismatch of a failure).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunLabel(pub String);

/// One MMA probe.
#[derive(Debug, Clone)]
pub struct Probe {
    pub family: Family,
    /// The check's name.
    pub what: String,
    pub source: KernelSource,
    /// The bytes the kernel reads (`in`).
    pub input: Vec<u8>,
    /// The kernel's arguments after `in` and `out`.
    pub args: Vec<u64>,
    /// The model's outputs, `[run][lane][reg]`.
    pub expected: Vec<f32>,
    pub runs: Vec<RunLabel>,
    /// (row, col) of accumulator `reg` of `lane` (the m16n8 C/D fragment).
    pub output_coords: fn(u32, u32) -> (u32, u32),
    /// The SASS instruction the compiled probe must contain, and how many at least.
    pub sass_opcode: &'static str,
    pub sass_min: usize,
}

impl Probe {
    /// Outputs equal to the model bit for bit; otherwise one line: how many differ and the
    /// first one (run, lane, register, the output element it is, got and expected).
    pub fn compare(&self, got: &[f32]) -> Result<(), String> {
        if got.len() != self.expected.len() {
            return Err(format!("{} outputs instead of {}", got.len(), self.expected.len()));
        }
        let bad: Vec<usize> =
            (0..got.len()).filter(|&i| got[i].to_bits() != self.expected[i].to_bits()).collect();
        let Some(&i) = bad.first() else { return Ok(()) };
        let (run, lane, reg) = (i / 128, (i / 4) % 32, i % 4);
        let (row, col) = (self.output_coords)(lane as u32, reg as u32);
        Err(format!(
            "{} of {} accumulators differ from the CPU model; first: {}, lane {lane} d{reg} \
             (D row {row}, column {col}) = {:e}, expected {:e}",
            bad.len(),
            got.len(),
            self.runs[run].0,
            got[i],
            self.expected[i]
        ))
    }

    fn arch(&self) -> &'static str {
        self.source.arch.as_str()
    }
}

/// Compile the probe for its architecture and count its tensor-core instruction in the SASS
/// (no GPU needed): PASS as compile only, FAIL when it does not compile or lacks the
/// instruction, SKIP when the SASS cannot be read (no cuobjdump).
pub fn compile_only(compiler: &Compiler, probe: &Probe) -> CheckResult {
    let what = format!("{} compiled for {}", probe.what, probe.arch());
    let kernel = match compiler.compile(&probe.source) {
        Ok(k) => k,
        Err(e) => {
            return CheckResult::fail(
                what,
                format!("does not compile: {}", one_line(&e.to_string())),
            )
        }
    };
    let text = match sass::dump_sass(&kernel.kernel_name, &kernel.cubin) {
        Ok(t) => t,
        Err(e @ SassError::NotFound { .. }) => {
            return CheckResult::skip(
                what,
                format!("compiles; its SASS could not be read: {}", one_line(&e.to_string())),
            )
        }
        Err(e) => return CheckResult::fail(what, one_line(&e.to_string())),
    };
    let n = sass::count_opcode(&text, probe.sass_opcode);
    if n >= probe.sass_min {
        CheckResult::pass(
            what,
            format!(
                "{n} x {} in its SASS (compile only: the probe did not run)",
                probe.sass_opcode
            ),
        )
    } else {
        CheckResult::fail(
            what,
            format!(
                "{n} x {} in its SASS, at least {} expected (one per probed instruction form)",
                probe.sass_opcode, probe.sass_min
            ),
        )
    }
}

/// Run the probe on `gpu` and compare its outputs with the model. `Err` is a CUDA error (the
/// context may be lost); a compile or load failure or a mismatch is a FAIL result.
pub fn run_on(gpu: &Gpu, compiler: &Compiler, probe: &Probe) -> Result<CheckResult, GpuError> {
    let what = format!("{} on the GPU", probe.what);
    let compiled = match compiler.compile(&probe.source) {
        Ok(k) => k,
        Err(e) => {
            return Ok(CheckResult::fail(
                what,
                format!("does not compile: {}", one_line(&e.to_string())),
            ))
        }
    };
    let kernel = match gpu.load(&compiled, 0) {
        Ok(k) => k,
        Err(e) => return Ok(CheckResult::fail(what, one_line(&e.to_string()))),
    };
    let input = gpu.upload(&probe.input)?;
    // NaN everywhere: an accumulator the kernel does not write is a mismatch.
    let out = gpu.upload(&vec![f32::NAN; probe.expected.len()])?;
    let mut args = vec![input.ptr(), out.ptr()];
    args.extend(&probe.args);
    let dims = LaunchDims { grid: (1, 1, 1), block: (32, 1, 1), smem_bytes: 0 };
    // SAFETY: the probe kernel takes (in, out, the probe's u64 arguments), all 64-bit; it reads
    // `probe.input.len()` bytes of `in` and writes `probe.expected.len()` floats of `out` (the
    // layout its module documents), both allocated above with those sizes and alive until the
    // synchronize below.
    unsafe { gpu.launch_u64s(&kernel, dims, &args) }?;
    gpu.synchronize()?;
    let got = gpu.download(&out)?;
    Ok(match probe.compare(&got) {
        Ok(()) => CheckResult::pass(
            what,
            format!(
                "bit-exact: {} runs x 32 lanes x 4 accumulators equal the CPU model",
                probe.runs.len()
            ),
        ),
        Err(why) => CheckResult::fail(what, why),
    })
}

#[cfg(test)]
mod tests {

    #[test]
    fn compare_names_the_first_mismatch_and_counts_them() {
        let p = super::super::sm90_probe::probe();
        assert_eq!(p.compare(&p.expected), Ok(()));
        let mut got = p.expected.clone();
        // Run 3, lane 5, d2; and one more.
        got[3 * 128 + 5 * 4 + 2] = 0.0;
        got[7 * 128] = f32::NAN;
        let e = p.compare(&got).unwrap_err();
        assert!(e.starts_with("2 of "), "{e}");
        assert!(
            e.contains(&p.runs[3].0) && e.contains("lane 5 d2 (D row 9, column 2) = 0e0"),
            "{e}"
        );
        assert!(!e.contains('\n'));
        // A sign is a mismatch.
        let mut signed = p.expected.clone();
        signed[200] = -signed[200];
        assert!(p.compare(&signed).unwrap_err().starts_with("1 of "));
        assert!(p.compare(&got[..10]).unwrap_err().contains("10 outputs"));
    }
}
