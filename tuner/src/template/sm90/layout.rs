//! CPU mirrors of `templates/sm90/layout.cuh` (the K permutation of the MMA fragments and the
//! shared-memory swizzles), tested without a GPU. The global scale layout is
//! `format::swizzle::swizzled_offset`.

/// The K permutation (`layout.cuh: k_local`): real k (within a chunk of `ch` = 64 or 128) of MMA
/// position `p` (0..16) at step `j` (0..ch/16). Lane t = (p % 8) / 2 owns k in [t*ch/4, (t+1)*ch/4).
pub fn k_local(ch: u32, j: u32, p: u32) -> u32 {
    ((p % 8) / 2) * (ch / 4) + 8 * (j / 2) + 2 * (j % 2) + p / 8 + 4 * (p % 2)
}

/// Physical 16-byte unit of logical unit `u` of row `r` in a packed-code tile of `units` units per
/// row (`layout.cuh: code_unit_swizzle`).
pub fn code_unit_swizzle(units: u32, r: u32, u: u32) -> u32 {
    match units {
        8 => u ^ (((r & 1) << 2) | (((r >> 1) & 1) << 1)),
        4 => u ^ (((r >> 1) & 1) << 1),
        _ => u,
    }
}

/// Physical 16-byte unit of logical unit `u` of row `r` in a bf16 tile (`layout.cuh: bf16_unit_swizzle`).
pub fn bf16_unit_swizzle(r: u32, u: u32) -> u32 {
    u ^ ((((u >> 3) & 1) << 1) | (r & 1))
}

/// 32-bit word of scale group `g` (4 scales, 64 k) of row `r` in a stage's scale tile of `rows`
/// rows and `groups` groups (`layout.cuh: sf_word`).
pub fn sf_word(rows: u32, groups: u32, r: u32, g: u32) -> u32 {
    if rows % 128 == 0 {
        ((r >> 7) * groups + g) * 128 + (r & 31) * 4 + ((r >> 5) & 3)
    } else {
        g * rows + r
    }
}
