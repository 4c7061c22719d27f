//! The problem description: one GEMM's operand types and sizes, kept apart from any kernel configuration.

use serde::{Deserialize, Serialize};
use std::fmt;

/// What the activation operand A is. The weight operand W is always NVFP4.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum AType {
    /// A is NVFP4 (packed E2M1 codes + swizzled UE4M3 scales): W4A4, the SM120 numerics.
    Nvfp4,
    /// A is BF16 row-major: W4A16, what Hopper deployments run.
    Bf16,
}

impl AType {
    pub fn as_str(self) -> &'static str {
        match self {
            AType::Nvfp4 => "w4a4",
            AType::Bf16 => "w4a16",
        }
    }
}

impl fmt::Display for AType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One GEMM: Y[M, N] (bf16) = alpha * deq(A)[M, K] * deq(W)[N, K]^T.
///
/// Device data layout shared by every kernel family (see ARCHITECTURE.md, "Data layout"):
/// - W codes: `[N, K/2]` bytes, row-major, element 2j in the low nibble (ModelOpt layout).
/// - W scales: UE4M3 in the swizzled 128x4 layout, rows padded to 128, scale columns to 4.
/// - A (NVFP4): codes `[M, K/2]` + swizzled scales as for W; A (BF16): `[M, K]` row-major.
/// - Y: `[M, N]` bf16 row-major.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct GemmProblem {
    pub m: u32,
    pub n: u32,
    pub k: u32,
    pub a_type: AType,
}

impl GemmProblem {
    pub fn new(m: u32, n: u32, k: u32, a_type: AType) -> Self {
        Self { m, n, k, a_type }
    }

    /// Bytes a kernel must move at least once: W codes + W scales + A + Y.
    pub fn min_bytes(&self) -> u64 {
        let (m, n, k) = (self.m as u64, self.n as u64, self.k as u64);
        let w = n * k / 2 + n * k / 16;
        let a = match self.a_type {
            AType::Nvfp4 => m * k / 2 + m * k / 16,
            AType::Bf16 => m * k * 2,
        };
        w + a + m * n * 2
    }

    /// Floating-point operations of the product (2*M*N*K).
    pub fn flops(&self) -> f64 {
        2.0 * self.m as f64 * self.n as f64 * self.k as f64
    }
}

impl fmt::Display for GemmProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "M={} N={} K={} {}", self.m, self.n, self.k, self.a_type)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_of_tp8_gate_up_expert() {
        // 512 x 6144 NVFP4 weights: 1,572,864 code bytes + 196,608 scale bytes.
        let p = GemmProblem::new(1, 512, 6144, AType::Bf16);
        assert_eq!(p.min_bytes(), 1_572_864 + 196_608 + 6144 * 2 + 512 * 2);
        assert_eq!(p.flops(), 2.0 * 512.0 * 6144.0);
    }
}
