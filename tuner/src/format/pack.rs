//! Nibble packing of E2M1 codes: two per byte along K, element 2j in the LOW nibble (bits 3:0)
//! and element 2j+1 in the HIGH nibble (the ModelOpt checkpoint and device layout).

use super::FormatError;

/// Pack 4-bit codes (one per byte, high nibbles must be zero) two per byte.
pub fn pack_nibbles(codes: &[u8]) -> Result<Vec<u8>, FormatError> {
    if codes.len() % 2 != 0 {
        return Err(FormatError::Shape {
            what: "codes to pack".into(),
            problem: format!("odd length {}", codes.len()),
        });
    }
    if let Some(i) = codes.iter().position(|&c| c > 15) {
        return Err(FormatError::Shape {
            what: "codes to pack".into(),
            problem: format!("element {i} is {:#x}, not a 4-bit code", codes[i]),
        });
    }
    Ok(codes.chunks_exact(2).map(|p| p[0] | (p[1] << 4)).collect())
}

/// Unpack bytes into one code per byte (low nibble first).
pub fn unpack_nibbles(packed: &[u8]) -> Vec<u8> {
    packed.iter().flat_map(|&b| [b & 0xf, b >> 4]).collect()
}

/// The code of element `i` of a packed row.
#[inline]
pub fn nibble_at(packed: &[u8], i: usize) -> u8 {
    (packed[i / 2] >> ((i & 1) * 4)) & 0xf
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn low_nibble_is_the_even_element() {
        let packed = pack_nibbles(&[0x1, 0x2, 0xf, 0x0, 0x8, 0x7]).unwrap();
        assert_eq!(packed, vec![0x21, 0x0f, 0x78]);
        assert_eq!(unpack_nibbles(&packed), vec![0x1, 0x2, 0xf, 0x0, 0x8, 0x7]);
        assert_eq!(nibble_at(&packed, 0), 0x1);
        assert_eq!(nibble_at(&packed, 1), 0x2);
        assert_eq!(nibble_at(&packed, 5), 0x7);
    }

    #[test]
    fn bad_input_is_rejected() {
        assert!(pack_nibbles(&[1, 2, 3]).is_err());
        let err = pack_nibbles(&[1, 0x10]).unwrap_err().to_string();
        assert!(err.contains("element 1"), "{err}");
    }
}
