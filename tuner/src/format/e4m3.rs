//! FP8 E4M3 (`float8_e4m3fn`, and UE4M3 for the never-negative block scales): decoding of all 256
//! codes and round-to-nearest-even, saturating encoding.
//!
//! Bias 7, max 448, smallest normal 2^-6, smallest subnormal 2^-9; 0x7F and 0xFF are NaN, there
//! is no infinity. Block scales are never negative, so their bytes read the same as UE4M3.
//!
//! The encoder is pure integer arithmetic on the f32 bits so that the GPU quantizer
//! (`templates/common/quantize.cuh`, `e4m3_encode`) can repeat it line by line.

/// Largest finite E4M3 magnitude.
pub const E4M3_MAX: f32 = 448.0;
/// Smallest positive (subnormal) E4M3 value, 2^-9.
pub const E4M3_MIN_SUBNORMAL: f32 = 1.0 / 512.0;
/// The canonical NaN code (0xFF is NaN too).
pub const E4M3_NAN: u8 = 0x7f;

/// Value of an E4M3 byte (NaN for 0x7F and 0xFF).
#[inline]
pub fn e4m3_decode(code: u8) -> f32 {
    let sign = if code & 0x80 != 0 { -1.0f32 } else { 1.0 };
    let e = ((code >> 3) & 0xf) as i32;
    let m = (code & 7) as f32;
    if e == 15 && code & 7 == 7 {
        return f32::NAN;
    }
    let mag = if e == 0 { m * E4M3_MIN_SUBNORMAL } else { (1.0 + m / 8.0) * 2f32.powi(e - 7) };
    sign * mag
}

/// Nearest E4M3 byte, ties to even. Magnitudes above 448 (infinity included) saturate to +-448
/// (like PTX `cvt.rn.satfinite.e4m3x2.f32`; note that torch's cast gives NaN from 480 up), NaN
/// gives 0x7F, magnitudes up to 2^-10 (ties to even) give +-0.
#[inline]
pub fn e4m3_encode(x: f32) -> u8 {
    let bits = x.to_bits();
    let sign = ((bits >> 24) & 0x80) as u8;
    let abs = bits & 0x7fff_ffff;
    if abs > 0x7f80_0000 {
        return E4M3_NAN;
    }
    if abs > 0x43e0_0000 {
        // > 448.0 (0x43E00000), infinity included: saturate.
        return sign | 0x7e;
    }
    let exp = (abs >> 23) as i32; // biased f32 exponent
    if exp >= 121 {
        // Normal in E4M3 (>= 2^-6): rebias 127 -> 7 and round the 20 dropped mantissa bits.
        let t = abs - (120u32 << 23);
        let rounded = (t + 0x7ffff + ((t >> 20) & 1)) >> 20;
        return sign | rounded as u8;
    }
    if exp == 0 {
        // f32 zero or subnormal (< 2^-126): rounds to zero.
        return sign;
    }
    // Subnormal in E4M3: value = mant * 2^(exp - 150); code = RNE(value * 2^9) = mant >> (141 - exp).
    let mant = (abs & 0x7f_ffff) | 0x80_0000;
    let shift = (141 - exp) as u32; // exp <= 120, so shift >= 21
    if shift >= 25 {
        // value < 2^-10: below half the smallest subnormal.
        return sign;
    }
    let q = mant >> shift;
    let rem = mant & ((1u32 << shift) - 1);
    let half = 1u32 << (shift - 1);
    let q = if rem > half || (rem == half && q & 1 == 1) { q + 1 } else { q };
    sign | q as u8
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_round_trips() {
        for code in 0..=255u8 {
            let v = e4m3_decode(code);
            if code & 0x7f == 0x7f {
                assert!(v.is_nan(), "{code:#x} must be NaN");
                assert_eq!(e4m3_encode(v), E4M3_NAN);
                continue;
            }
            assert!(v.is_finite());
            assert_eq!(e4m3_encode(v), code, "code {code:#04x} value {v}");
        }
    }

    #[test]
    fn known_values() {
        assert_eq!(e4m3_decode(0x7e), 448.0);
        assert_eq!(e4m3_decode(0x01), 1.0 / 512.0);
        assert_eq!(e4m3_decode(0x08), 1.0 / 64.0);
        assert_eq!(e4m3_decode(0x38), 1.0);
        assert_eq!(e4m3_decode(0xb8), -1.0);
        assert_eq!(e4m3_encode(1.0), 0x38);
        assert_eq!(e4m3_encode(1.5), 0x3c);
        assert_eq!(e4m3_encode(-2.0), 0xc0);
    }

    /// Independent reference: the nearest of all finite codes, ties to the even code.
    fn brute_force(x: f32) -> u8 {
        let mut best = 0u8;
        let mut best_err = f64::INFINITY;
        for code in 0..=0x7eu8 {
            let err = (e4m3_decode(code) as f64 - (x.abs() as f64)).abs();
            if err < best_err || (err == best_err && code & 1 == 0) {
                best = code;
                best_err = err;
            }
        }
        if x < 0.0 || (x == 0.0 && x.is_sign_negative()) {
            best | 0x80
        } else {
            best
        }
    }

    #[test]
    fn matches_brute_force_nearest_even() {
        use rand::{rngs::StdRng, Rng, SeedableRng};
        let mut probes = vec![0.0f32, -0.0, 448.0, 447.9, 1.0 / 1024.0, 1.0 / 1023.0, 3.0 / 1024.0];
        // Midpoints and their neighbours between consecutive codes.
        for code in 0..0x7eu8 {
            let mid = ((e4m3_decode(code) as f64 + e4m3_decode(code + 1) as f64) / 2.0) as f32;
            probes.extend([
                mid,
                f32::from_bits(mid.to_bits() + 1),
                f32::from_bits(mid.to_bits() - 1),
            ]);
        }
        let mut rng = StdRng::seed_from_u64(7);
        for _ in 0..20000 {
            let e: i32 = rng.random_range(-12..10);
            probes.push(rng.random_range(-1.0f32..1.0) * 2f32.powi(e));
        }
        for x in probes {
            if x.abs() > 448.0 {
                continue;
            }
            assert_eq!(e4m3_encode(x), brute_force(x), "x = {x:e}");
        }
    }

    #[test]
    fn ties_saturation_and_specials() {
        // 2^-10 is half the smallest subnormal: tie to even (zero); just above goes up.
        assert_eq!(e4m3_encode(1.0 / 1024.0), 0x00);
        assert_eq!(e4m3_encode(f32::from_bits((1.0f32 / 1024.0).to_bits() + 1)), 0x01);
        // 3 * 2^-10 lies between codes 1 and 2: tie to even (2).
        assert_eq!(e4m3_encode(3.0 / 1024.0), 0x02);
        // 1 + 1/16 lies between 1 (0x38) and 1.125 (0x39): tie to even (0x38).
        assert_eq!(e4m3_encode(1.0625), 0x38);
        assert_eq!(e4m3_encode(1.1875), 0x3a);
        // 432 is the midpoint of 416 and 448: tie to even (448 = 0x7e).
        assert_eq!(e4m3_encode(432.0), 0x7e);
        assert_eq!(e4m3_encode(449.0), 0x7e);
        assert_eq!(e4m3_encode(1e9), 0x7e);
        assert_eq!(e4m3_encode(f32::INFINITY), 0x7e);
        assert_eq!(e4m3_encode(f32::NEG_INFINITY), 0xfe);
        assert_eq!(e4m3_encode(-500.0), 0xfe);
        assert_eq!(e4m3_encode(f32::NAN), 0x7f);
        assert_eq!(e4m3_encode(1e-30), 0x00);
        assert_eq!(e4m3_encode(-1e-30), 0x80);
        assert_eq!(e4m3_encode(f32::from_bits(1)), 0x00);
    }
}
