//! The routed-row schedule: the CPU mirror of `moe_align` (templates/moe/align.cuh) and the
//! seeded routings the tuner and the benchmark draw.

use serde::{Deserialize, Serialize};

/// BLOCK_M of each tile list, in list order (templates/moe/params.cuh TILE_LISTS).
pub const TILE_BLOCK_M: [u32; 5] = [8, 16, 32, 64, 128];
/// Local experts moe_align handles (ALIGN_MAX_EXPERTS).
pub const MAX_EXPERTS: u32 = 512;

/// Capacity of every tile list for `tokens * top_k` routed ids over `experts` local experts:
/// the bound of the list of 8-row tiles, the longest (`list_tiles`).
pub fn max_tiles(tokens: u32, top_k: u32, experts: u32) -> u32 {
    list_tiles(tokens, top_k, experts, TILE_BLOCK_M[0])
}

/// Most tiles the list of `block_m`-row tiles can hold for `tokens * top_k` routed ids over
/// `experts` local experts: sum over experts of ceil(rows_e / block_m) <= min(experts, rows) +
/// rows / block_m (each non-empty expert adds at most one partial tile). A one-tile-per-CTA
/// grid of this height leaves no CTA of a full list without its tile and launches few empty ones.
pub fn list_tiles(tokens: u32, top_k: u32, experts: u32, block_m: u32) -> u32 {
    // in u64 and saturated: a bound past u32 is refused by every use, never wrapped
    let rows = u64::from(tokens) * u64::from(top_k);
    let tiles = u64::from(experts).min(rows) + rows / u64::from(block_m.max(1));
    u32::try_from(tiles).unwrap_or(u32::MAX)
}

/// One tile: up to BLOCK_M consecutive sorted rows of one expert.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tile {
    pub expert: u32,
    pub first_row: u32,
    pub rows: u32,
}

/// What moe_align writes, as the CPU computes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteSchedule {
    /// `[experts + 1]` prefix sums of routed rows per local expert.
    pub offsets: Vec<i32>,
    /// Flat ids (token * top_k + slot) grouped by expert, increasing inside each expert;
    /// `offsets[experts]` entries.
    pub sorted_ids: Vec<i32>,
    /// `[tokens * top_k]`: sorted position of each flat id, -1 when not local.
    pub inverse: Vec<i32>,
    /// One list per `TILE_BLOCK_M`.
    pub tiles: [Vec<Tile>; TILE_BLOCK_M.len()],
}

impl RouteSchedule {
    /// The stable counting sort of `topk_ids` (`[tokens, top_k]`, global expert ids) over local
    /// experts `expert_begin .. expert_begin + experts`.
    pub fn build(topk_ids: &[i32], expert_begin: i32, experts: u32) -> RouteSchedule {
        let e_n = experts as usize;
        let local = |id: i32| -> Option<usize> {
            let e = id as i64 - expert_begin as i64;
            (e >= 0 && e < experts as i64).then_some(e as usize)
        };
        let mut count = vec![0i32; e_n];
        for &id in topk_ids {
            if let Some(e) = local(id) {
                count[e] += 1;
            }
        }
        let mut offsets = vec![0i32; e_n + 1];
        for e in 0..e_n {
            offsets[e + 1] = offsets[e] + count[e];
        }
        let mut cursor = offsets[..e_n].to_vec();
        let mut sorted_ids = vec![0i32; offsets[e_n] as usize];
        let mut inverse = vec![-1i32; topk_ids.len()];
        for (i, &id) in topk_ids.iter().enumerate() {
            if let Some(e) = local(id) {
                let pos = cursor[e];
                cursor[e] += 1;
                sorted_ids[pos as usize] = i as i32;
                inverse[i] = pos;
            }
        }
        let tiles = TILE_BLOCK_M.map(|bm| {
            let mut list = Vec::new();
            for e in 0..e_n {
                let mut r = 0;
                while r < count[e] {
                    let rows = (bm as i32).min(count[e] - r);
                    list.push(Tile {
                        expert: e as u32,
                        first_row: (offsets[e] + r) as u32,
                        rows: rows as u32,
                    });
                    r += bm as i32;
                }
            }
            list
        });
        RouteSchedule { offsets, sorted_ids, inverse, tiles }
    }

    /// Local experts with at least one row.
    pub fn active_experts(&self) -> u32 {
        self.offsets.windows(2).filter(|w| w[1] > w[0]).count() as u32
    }

    /// Routed rows on this GPU.
    pub fn rows(&self) -> u32 {
        *self.offsets.last().unwrap_or(&0) as u32
    }

    /// The local expert of sorted row `r`.
    pub fn expert_of_row(&self, r: u32) -> u32 {
        (self.offsets.partition_point(|&o| o <= r as i32) - 1) as u32
    }
}

/// How a routing is drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Routing {
    /// Every token picks top_k distinct experts uniformly at random.
    Uniform,
    /// Every token routes to experts 0, 1, 2 (as many of them as top_k allows), the rest uniform.
    Skewed,
    /// A shared expert joined as the last expert: every token's last slot is expert
    /// `experts_total - 1`, its other slots uniform over the experts below it (an engine that
    /// fuses the shared expert hands over E + 1 experts and top_k + 1 slots).
    SharedLast,
}

/// SplitMix64: the generator of routings, simple enough to mirror in any peer script.
#[derive(Debug, Clone)]
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in 0..n (n > 0), by the modulo of the 64-bit draw.
    pub fn below(&mut self, n: u32) -> u32 {
        (self.next_u64() % n as u64) as u32
    }
}

/// `topk_ids [tokens, top_k]` over `experts_total` global experts, drawn from `seed`: each token
/// draws until it has top_k distinct experts (skewed: experts 0..3 first; shared-last: the last
/// expert in the last slot, the others drawn from the experts below it).
pub fn draw_routing(
    seed: u64,
    tokens: u32,
    top_k: u32,
    experts_total: u32,
    routing: Routing,
) -> Vec<i32> {
    let mut rng = SplitMix64(seed);
    let mut ids = Vec::with_capacity((tokens * top_k) as usize);
    for _ in 0..tokens {
        let mut picked: Vec<u32> = Vec::with_capacity(top_k as usize);
        if routing == Routing::Skewed {
            picked.extend((0..3.min(top_k).min(experts_total)).collect::<Vec<_>>());
        }
        // the shared expert takes the last slot; the routed slots draw from the experts below it
        let (routed, shared) = match routing {
            Routing::SharedLast if top_k > 0 && experts_total > 0 => {
                (experts_total - 1, Some(experts_total - 1))
            }
            _ => (experts_total, None),
        };
        let slots = top_k.min(experts_total) - u32::from(shared.is_some());
        while (picked.len() as u32) < slots {
            let e = rng.below(routed);
            if !picked.contains(&e) {
                picked.push(e);
            }
        }
        picked.extend(shared);
        ids.extend(picked.iter().map(|&e| e as i32));
    }
    ids
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check_invariants(ids: &[i32], begin: i32, experts: u32, s: &RouteSchedule) {
        let local: Vec<bool> =
            ids.iter().map(|&id| id >= begin && id < begin + experts as i32).collect();
        assert_eq!(s.rows() as usize, local.iter().filter(|&&l| l).count());
        // every local id appears exactly once, at its inverse position, inside its expert's segment
        for (i, &id) in ids.iter().enumerate() {
            if local[i] {
                let pos = s.inverse[i];
                assert_eq!(s.sorted_ids[pos as usize], i as i32);
                let e = (id - begin) as usize;
                assert!(s.offsets[e] <= pos && pos < s.offsets[e + 1]);
            } else {
                assert_eq!(s.inverse[i], -1);
            }
        }
        // stable: increasing flat ids inside each expert
        for e in 0..experts as usize {
            let seg = &s.sorted_ids[s.offsets[e] as usize..s.offsets[e + 1] as usize];
            assert!(seg.windows(2).all(|w| w[0] < w[1]));
        }
        // tiles: each list covers every row once, in order, none empty, none over BLOCK_M
        for (l, bm) in TILE_BLOCK_M.iter().enumerate() {
            let mut next = 0;
            for t in &s.tiles[l] {
                assert!(t.rows >= 1 && t.rows <= *bm);
                assert_eq!(t.first_row, next);
                assert_eq!(s.expert_of_row(t.first_row), t.expert);
                assert_eq!(s.expert_of_row(t.first_row + t.rows - 1), t.expert);
                next += t.rows;
            }
            assert_eq!(next, s.rows());
            let tokens = ids.len() as u32; // with top_k = 1 in the bounds below
            assert!(s.tiles[l].len() as u32 <= list_tiles(tokens, 1, experts, *bm));
            assert!(list_tiles(tokens, 1, experts, *bm) <= max_tiles(tokens, 1, experts));
        }
    }

    #[test]
    fn the_schedule_is_a_stable_sort_with_an_inverse_and_covering_tiles() {
        for (tokens, top_k, total, begin, experts, routing) in [
            (1u32, 8u32, 256u32, 0i32, 256u32, Routing::Uniform),
            (64, 8, 256, 0, 256, Routing::Uniform),
            (256, 8, 256, 0, 256, Routing::Skewed),
            (1024, 8, 256, 0, 256, Routing::Uniform),
            (64, 1, 256, 0, 256, Routing::Uniform),
            (64, 8, 256, 96, 32, Routing::Uniform),
            (300, 8, 256, 224, 32, Routing::Skewed),
            (8, 9, 257, 0, 257, Routing::SharedLast),
            (300, 9, 257, 0, 257, Routing::SharedLast),
        ] {
            let ids = draw_routing(tokens as u64 * 7 + 1, tokens, top_k, total, routing);
            assert_eq!(ids.len() as u32, tokens * top_k);
            let s = RouteSchedule::build(&ids, begin, experts);
            check_invariants(&ids, begin, experts, &s);
        }
    }

    /// templates/moe/align.cuh step by step: rounds of ALIGN_THREADS ids, warps of 32 lanes,
    /// `__match_any_sync` groups and their leaders. Pass 1 counts; 16 warps of 32 experts scan
    /// (count, tiles per list) with per-warp inclusive scans plus the totals of the lower warps,
    /// and each expert's thread writes its offset and tiles; pass 2 places: leaders record their
    /// group's size and set their warp's bit in the expert's mask, an id lands at cursor + the
    /// groups of the lower warps in the mask + its rank, and between rounds the last warp's leader
    /// moves the cursor and clears the mask (the group sizes stay, valid only where a mask says).
    fn align_kernel_model(ids: &[i32], begin: i32, experts: u32) -> RouteSchedule {
        const THREADS: usize = crate::moe::templates::ALIGN_THREADS as usize;
        let (r_n, e_n) = (ids.len(), experts as usize);
        let local = |i: usize| -> i32 {
            let e = ids[i] as i64 - begin as i64;
            if e >= 0 && e < experts as i64 {
                e as i32
            } else {
                -1
            }
        };
        // one round's experts (-1: not local or past the ids) and match groups
        let round = |r0: usize| -> (Vec<i32>, Vec<u32>) {
            let e: Vec<i32> =
                (0..THREADS).map(|t| if r0 + t < r_n { local(r0 + t) } else { -1 }).collect();
            let peers = (0..THREADS)
                .map(|t| {
                    let w = t / 32 * 32;
                    (0..32).filter(|&l| e[w + l] == e[t]).fold(0u32, |m, l| m | 1 << l)
                })
                .collect();
            (e, peers)
        };
        let leader =
            |e: i32, peers: u32, t: usize| e >= 0 && t % 32 == peers.trailing_zeros() as usize;
        // pass 1
        let mut count = vec![0i32; e_n];
        for r0 in (0..r_n).step_by(THREADS) {
            let (e, peers) = round(r0);
            for t in 0..THREADS {
                if r0 == 0 && leader(e[t], peers[t], t) {
                    count[e[t] as usize] += peers[t].count_ones() as i32;
                } else if r0 > 0 && e[t] >= 0 {
                    count[e[t] as usize] += 1;
                }
            }
        }
        // the scan: thread x of the 16 scanning warps holds expert x
        const V: usize = 1 + TILE_BLOCK_M.len();
        let max_e = MAX_EXPERTS as usize;
        let v: Vec<[i32; V]> = (0..max_e)
            .map(|x| {
                let c = if x < e_n { count[x] } else { 0 };
                let mut row = [c; V];
                for (l, bm) in TILE_BLOCK_M.iter().enumerate() {
                    row[1 + l] = (c + *bm as i32 - 1) / *bm as i32;
                }
                row
            })
            .collect();
        let mut incl = v.clone();
        for x in (0..max_e).filter(|x| x % 32 != 0) {
            let prev = incl[x - 1];
            for (a, b) in incl[x].iter_mut().zip(prev) {
                *a += b;
            }
        }
        let warp_total: Vec<[i32; V]> = (0..max_e / 32).map(|w| incl[w * 32 + 31]).collect();
        let mut offsets = vec![0i32; e_n + 1];
        let mut cursor = vec![0i32; e_n];
        let mut tiles: [Vec<Tile>; TILE_BLOCK_M.len()] = Default::default();
        let mut firsts = vec![[0i32; V]; e_n];
        for x in 0..e_n {
            let mut excl = [0i32; V];
            for j in 0..V {
                excl[j] =
                    incl[x][j] - v[x][j] + warp_total[..x / 32].iter().map(|t| t[j]).sum::<i32>();
            }
            firsts[x] = excl;
            cursor[x] = excl[0];
            offsets[x] = excl[0];
            if x == e_n - 1 {
                offsets[e_n] = excl[0] + v[x][0];
            }
        }
        for (l, bm) in TILE_BLOCK_M.iter().enumerate() {
            let total = firsts.last().map_or(0, |f| f[1 + l]) + v[e_n - 1][1 + l];
            let mut list = vec![None; total as usize];
            for x in 0..e_n {
                let c = v[x][0];
                for j in 0..v[x][1 + l] {
                    let rows = (*bm as i32).min(c - j * *bm as i32) as u32;
                    let first_row = (firsts[x][0] + j * *bm as i32) as u32;
                    list[(firsts[x][1 + l] + j) as usize] =
                        Some(Tile { expert: x as u32, first_row, rows });
                }
            }
            tiles[l] = list.into_iter().map(|t| t.expect("every tile slot written")).collect();
        }
        // pass 2: masks and group sizes persist across rounds, as in shared memory
        let mut sorted = vec![-1; offsets[e_n] as usize];
        let mut inverse = vec![i32::MIN; r_n];
        let mut mask = vec![0u32; e_n];
        let mut group = vec![[u16::MAX; 32]; e_n];
        for r0 in (0..r_n).step_by(THREADS) {
            let (e, peers) = round(r0);
            for t in (0..THREADS).filter(|&t| leader(e[t], peers[t], t)) {
                group[e[t] as usize][t / 32] = peers[t].count_ones() as u16;
                mask[e[t] as usize] |= 1 << (t / 32);
            }
            let mut moves = Vec::new();
            for t in 0..THREADS {
                let (i, warp, lane) = (r0 + t, t / 32, t % 32);
                if e[t] < 0 {
                    if i < r_n {
                        inverse[i] = -1;
                    }
                    continue;
                }
                let x = e[t] as usize;
                let lower = mask[x] & ((1u32 << warp) - 1);
                let below: i32 =
                    (0..32).filter(|w| lower >> w & 1 == 1).map(|w| group[x][w] as i32).sum();
                let pos = cursor[x] + below + (peers[t] & ((1u32 << lane) - 1)).count_ones() as i32;
                sorted[pos as usize] = i as i32;
                inverse[i] = pos;
                if leader(e[t], peers[t], t) && mask[x] >> warp == 1 {
                    moves.push((x, below + peers[t].count_ones() as i32));
                }
            }
            for (x, d) in moves {
                cursor[x] += d;
                mask[x] = 0;
            }
        }
        RouteSchedule { offsets, sorted_ids: sorted, inverse, tiles }
    }

    #[test]
    fn the_align_kernel_model_is_the_stable_counting_sort() {
        // one round (decode) and several (prefill), uniform and skewed, all experts local or a
        // slice of them (expert parallelism), top_k 8 and 1, 1 to 512 experts
        for (tokens, top_k, total, begin, experts, routing) in [
            (1u32, 8u32, 256u32, 0i32, 256u32, Routing::Uniform),
            (64, 8, 256, 0, 256, Routing::Uniform),
            (128, 8, 256, 0, 256, Routing::Skewed),
            (300, 8, 256, 0, 256, Routing::Uniform),
            (600, 8, 256, 224, 32, Routing::Skewed),
            (1000, 1, 256, 0, 256, Routing::Uniform),
            (2500, 1, 256, 96, 32, Routing::Uniform),
            (200, 8, 512, 0, 512, Routing::Uniform),
            (700, 4, 512, 100, 33, Routing::Uniform),
            (300, 2, 64, 5, 1, Routing::Uniform),
            (130, 9, 257, 0, 257, Routing::SharedLast),
        ] {
            let ids = draw_routing(tokens as u64 + 5, tokens, top_k, total, routing);
            let want = RouteSchedule::build(&ids, begin, experts);
            assert_eq!(
                align_kernel_model(&ids, begin, experts),
                want,
                "B {tokens} top_k {top_k} experts {begin}..+{experts}"
            );
        }
        // every id to one expert: one group per warp, 32 warps per round
        let ids = vec![7; 3000];
        assert_eq!(align_kernel_model(&ids, 0, 8), RouteSchedule::build(&ids, 0, 8));
    }

    #[test]
    fn ids_of_other_gpus_and_out_of_range_ids_are_skipped() {
        let ids = [5, -1, 40, 33, 32, 1 << 30, 32, 63, 64];
        let s = RouteSchedule::build(&ids, 32, 32);
        assert_eq!(s.rows(), 5);
        assert_eq!(s.inverse, vec![-1, -1, 3, 2, 0, -1, 1, 4, -1]);
        assert_eq!(s.sorted_ids, vec![4, 6, 3, 2, 7]);
        assert_eq!(s.active_experts(), 4);
        check_invariants(&ids, 32, 32, &s);
    }

    #[test]
    fn empty_experts_get_no_tile_and_skew_gets_many() {
        let ids: Vec<i32> = (0..64).map(|_| 3).collect();
        let s = RouteSchedule::build(&ids, 0, 256);
        assert_eq!(s.tiles[0].len(), 8);
        assert_eq!(s.tiles[2].len(), 2);
        assert!(s.tiles[0].iter().all(|t| t.expert == 3));
        assert_eq!(s.active_experts(), 1);
    }

    #[test]
    fn routings_are_distinct_experts_per_token_and_reproducible() {
        let a = draw_routing(42, 100, 8, 256, Routing::Uniform);
        assert_eq!(a, draw_routing(42, 100, 8, 256, Routing::Uniform));
        assert_ne!(a, draw_routing(43, 100, 8, 256, Routing::Uniform));
        for t in a.chunks(8) {
            let mut v = t.to_vec();
            v.sort();
            v.dedup();
            assert_eq!(v.len(), 8);
            assert!(v.iter().all(|&e| (0..256).contains(&e)));
        }
        let s = draw_routing(1, 10, 8, 256, Routing::Skewed);
        assert!(s.chunks(8).all(|t| t[..3] == [0, 1, 2]));
        // a shared expert joined as expert 256 of 257: in every token's last slot, nowhere else
        let s = draw_routing(3, 50, 9, 257, Routing::SharedLast);
        for t in s.chunks(9) {
            assert_eq!(t[8], 256);
            let mut v = t[..8].to_vec();
            v.sort();
            v.dedup();
            assert_eq!(v.len(), 8);
            assert!(v.iter().all(|&e| (0..256).contains(&e)));
        }
        // a shared expert alone (top_k 1) and the uniform draw unchanged by the routed range
        assert_eq!(draw_routing(3, 4, 1, 257, Routing::SharedLast), [256; 4]);
        // the first draws of the generator are fixed (peer scripts mirror it)
        let mut g = SplitMix64(0);
        assert_eq!(g.next_u64(), 0xE220_A839_7B1D_CDAF);
        // scripts/moe_peers.py draws the same routing for B = 1 of a benchmark (seed 1000 + B)
        assert_eq!(
            draw_routing(1001, 1, 8, 256, Routing::Uniform),
            [212, 88, 177, 47, 171, 185, 40, 121]
        );
    }
}
