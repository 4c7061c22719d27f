//! FP4 E2M1 elements: decoding of the 16 codes and round-half-to-even, saturating encoding.
//!
//! Bit 3 is the sign, bits 2:1 the exponent (bias 1), bit 0 the mantissa. Codes 0..7 are
//! 0, 0.5, 1, 1.5, 2, 3, 4, 6 and codes 8..15 their negatives (8 is -0). No Inf, no NaN.

/// Magnitudes of codes 0..7.
pub const E2M1_VALUES: [f32; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];

/// Largest finite E2M1 magnitude.
pub const E2M1_MAX: f32 = 6.0;

/// Value of a 4-bit code (only the low nibble is read).
#[inline]
pub fn e2m1_decode(code: u8) -> f32 {
    let v = E2M1_VALUES[(code & 7) as usize];
    if code & 8 != 0 {
        -v
    } else {
        v
    }
}

/// Nearest E2M1 code, ties to even, magnitudes above 6 saturate to 6.
///
/// This is ModelOpt's `_cast_fp4` exactly: the sign bit is `x < 0` (so -0.0 gives code 0 and a
/// negative value that rounds to zero gives code 8), and NaN gives code 7 (+6), like its
/// `searchsorted`. The comparison chain below is the contract the GPU quantizer repeats verbatim
/// (`templates/common/quantize.cuh`, `e2m1_encode`).
#[inline]
pub fn e2m1_encode(x: f32) -> u8 {
    let sign: u8 = if x < 0.0 { 8 } else { 0 };
    let a = f32::from_bits(x.to_bits() & 0x7fff_ffff);
    let mag: u8 = if a <= 0.25 {
        0
    } else if a < 0.75 {
        1
    } else if a <= 1.25 {
        2
    } else if a < 1.75 {
        3
    } else if a <= 2.5 {
        4
    } else if a < 3.5 {
        5
    } else if a <= 5.0 {
        6
    } else {
        7
    };
    sign | mag
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_round_trips() {
        for code in 0u8..16 {
            let v = e2m1_decode(code);
            let back = e2m1_encode(v);
            // -0.0 is not < 0, so code 8 comes back as code 0 (ModelOpt does the same).
            let expect = if code == 8 { 0 } else { code };
            assert_eq!(back, expect, "code {code} value {v}");
        }
        assert_eq!(e2m1_decode(8).to_bits(), (-0.0f32).to_bits());
        assert_eq!(e2m1_decode(15), -6.0);
        assert_eq!(e2m1_decode(0x17), e2m1_decode(7), "high nibble must be ignored");
    }

    #[test]
    fn ties_round_half_to_even() {
        let cases = [
            (0.25, 0.0),
            (0.75, 1.0),
            (1.25, 1.0),
            (1.75, 2.0),
            (2.5, 2.0),
            (3.5, 4.0),
            (5.0, 4.0),
        ];
        for (x, want) in cases {
            assert_eq!(e2m1_decode(e2m1_encode(x)), want, "{x}");
            assert_eq!(e2m1_decode(e2m1_encode(-x)), -want, "-{x}");
        }
    }

    #[test]
    fn off_tie_values_saturation_and_specials() {
        let cases = [
            (0.2500001, 0.5),
            (0.7499999, 0.5),
            (1.2500001, 1.5),
            (2.5000002, 3.0),
            (5.0000005, 6.0),
            (6.0, 6.0),
            (7.0, 6.0),
            (1e30, 6.0),
            (f32::INFINITY, 6.0),
        ];
        for (x, want) in cases {
            assert_eq!(e2m1_decode(e2m1_encode(x)), want, "{x}");
        }
        assert_eq!(e2m1_encode(f32::NEG_INFINITY), 15);
        assert_eq!(e2m1_encode(f32::NAN), 7);
        assert_eq!(e2m1_encode(-0.1), 8);
        assert_eq!(e2m1_encode(-0.0), 0);
    }
}
