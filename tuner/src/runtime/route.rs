//! Why a launch runs what it runs, for GEMMs ([`Route`]: the bucket of M, or the fallback for a
//! shape the table does not know) and for the grouped MoE operations ([`MoeRoute`]: the grouped
//! kernel of the token bucket B nearest in log scale, why that bucket, and whether the entries
//! were tuned with other kernel templates). One text per route (`Display`), the same from Rust
//! ([`super::Dispatcher::route`], [`super::Dispatcher::moe_route`]) and from C (`fp4tune_route`,
//! `fp4tune_moe_route`).
//!
//! [`MoeRouteTable`] is the table's grouped routes without a GPU: the entries per layer shape and
//! activation type, buckets ascending, picked with [`super::moe::nearest_bucket`], the function
//! the grouped launches pick their kernels with.

use super::error::RuntimeError;
use super::moe::nearest_bucket;
use crate::moe::{GroupedConfig, MoeOp, MoeShape};
use crate::problem::AType;
use crate::table::{Method, Table};
use crate::template::{Family, GemmConfig};
use std::fmt;

/// How a launch's configuration was chosen (cheap to copy; the hot path returns it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouteKind {
    Exact,
    NearestBucket {
        bucket: u32,
    },
    /// The table's common configuration (shape not in the table).
    Common,
    /// The family default (shape not in the table, or the table's family disabled).
    Default,
}

/// The configuration a launch uses and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route {
    /// The fused kernel (for `Method::DequantCublasBf16`, the entry's fallback kernel).
    pub config: GemmConfig,
    /// What the launch runs: the fused kernel, or the dequantize-then-cuBLAS path.
    pub method: Method,
    pub kind: RouteKind,
}

impl Route {
    /// The kernel configuration's name, or the composite method's label.
    pub fn name(&self) -> String {
        match self.method {
            Method::Fused => self.config.name(),
            m => m.label().to_string(),
        }
    }
}

impl fmt::Display for RouteKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RouteKind::Exact => f.write_str("exact"),
            RouteKind::NearestBucket { bucket } => write!(f, "nearest bucket M={bucket}"),
            RouteKind::Common => f.write_str("not in the table: common configuration"),
            RouteKind::Default => f.write_str("not in the table: family default"),
        }
    }
}

/// `<kernel or method> (<why>)`, e.g. `sm90_w4a16_m16n64k128_w1x4x1_s4_sk1_swap (nearest bucket
/// M=16)` or `dequant_cublas_bf16 (exact)`.
impl fmt::Display for Route {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.name(), self.kind)
    }
}

/// Why a grouped operation runs the kernel of its bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MoeRouteKind {
    /// The token count is a tuned bucket.
    Exact,
    /// Between two tuned buckets: the nearer in log scale (a tie takes the larger).
    Between { lower: u32, upper: u32 },
    /// Fewer tokens than the smallest tuned bucket.
    BelowSmallest,
    /// More tokens than the largest tuned bucket.
    AboveLargest,
}

/// The grouped kernel one operation of a layer launches for a token count, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MoeRoute {
    pub op: MoeOp,
    pub a_type: AType,
    /// The step's token count B asked about.
    pub tokens: u32,
    /// The tuned bucket whose kernel runs.
    pub bucket: u32,
    pub config: GroupedConfig,
    pub kind: MoeRouteKind,
    /// Family sm120, a kernel split along K: the most tiles (of `config.block_m` routed rows) a
    /// step may have for its CTAs to split K, the room of a stream's workspace
    /// (`moe::sm120::split_tiles`); a step with more runs unsplit. 0 otherwise.
    pub split_room: u32,
    /// The table's grouped entries were tuned with other grouped kernel templates: the kernel is
    /// built from this build's templates and the entry's recorded time may not hold.
    pub stale_templates: bool,
    /// The table has no entries for this layer and activation type: the buckets are the family
    /// defaults (`moe::defaults`).
    pub family_default: bool,
}

impl MoeRoute {
    /// The route of `op` for `tokens` over `buckets` (ascending, not empty): the bucket
    /// [`nearest_bucket`] picks, which is what the grouped launches run.
    pub fn pick(
        op: MoeOp,
        a_type: AType,
        shape: &MoeShape,
        buckets: &[(u32, GroupedConfig)],
        tokens: u32,
        stale_templates: bool,
    ) -> MoeRoute {
        let i = nearest_bucket(buckets.iter().map(|(b, _)| *b), tokens);
        let (bucket, config) = buckets[i];
        let kind = if bucket == tokens {
            MoeRouteKind::Exact
        } else if tokens < buckets[0].0 {
            MoeRouteKind::BelowSmallest
        } else if tokens > buckets[buckets.len() - 1].0 {
            MoeRouteKind::AboveLargest
        } else {
            // tokens lies strictly between two neighbouring buckets, one of which is `bucket`.
            let upper = buckets.partition_point(|(b, _)| *b < tokens);
            MoeRouteKind::Between { lower: buckets[upper - 1].0, upper: buckets[upper].0 }
        };
        let split_room = match config.family {
            Family::Sm120 => crate::moe::sm120::split_room(&config, shape),
            Family::Sm90 => 0,
        };
        MoeRoute {
            op,
            a_type,
            tokens,
            bucket,
            config,
            kind,
            split_room,
            stale_templates,
            family_default: false,
        }
    }

    fn op_label(&self) -> &'static str {
        match self.op {
            MoeOp::GateUp => "gate_up",
            MoeOp::Down => "down",
        }
    }
}

/// `<op> <kernel> (<why>)`, e.g. `gate_up moe_... (nearest bucket B=16: 20 lies between B=16
/// and B=32, nearer in log scale)`.
impl fmt::Display for MoeRoute {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {} (", self.op_label(), self.config)?;
        match self.kind {
            MoeRouteKind::Exact => f.write_str("exact")?,
            MoeRouteKind::Between { lower, upper } => write!(
                f,
                "nearest bucket B={}: {} lies between B={lower} and B={upper}, nearer in log scale",
                self.bucket, self.tokens
            )?,
            MoeRouteKind::BelowSmallest => write!(
                f,
                "nearest bucket B={}: {} is below the smallest {} B",
                self.bucket,
                self.tokens,
                if self.family_default { "default" } else { "tuned" }
            )?,
            MoeRouteKind::AboveLargest => write!(
                f,
                "nearest bucket B={}: {} is above the largest {} B",
                self.bucket,
                self.tokens,
                if self.family_default { "default" } else { "tuned" }
            )?,
        }
        if self.split_room > 0 {
            write!(
                f,
                "; K over {} CTAs when the step has at most {} tiles of {} routed rows",
                self.config.split_k, self.split_room, self.config.block_m
            )?;
        }
        if self.stale_templates {
            f.write_str("; tuned with other grouped templates, built from this build's")?;
        }
        if self.family_default {
            f.write_str("; family default: the table has no entry for this layer")?;
        }
        f.write_str(")")
    }
}

/// The grouped kernels a layer launches for a token count: gate_up and down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MoeLayerRoute {
    pub shape: MoeShape,
    pub a_type: AType,
    pub gate_up: MoeRoute,
    pub down: MoeRoute,
}

/// `<a_type>: gate_up <kernel> (<why>); down <kernel> (<why>)`.
impl fmt::Display for MoeLayerRoute {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}; {}", self.a_type, self.gate_up, self.down)
    }
}

/// `table` when it has grouped entries and they are of `family` (a table is measured on one
/// device, so all of them or none): the entries a device of `family` runs.
pub fn own_grouped(table: Option<&Table>, family: Family) -> Option<&Table> {
    table.filter(|t| !t.moe.is_empty() && t.moe.iter().all(|e| e.key.family == family))
}

/// One layer's grouped entries: per op (bucket, configuration), buckets ascending.
#[derive(Debug, Clone, PartialEq)]
struct Layer {
    shape: MoeShape,
    a_type: AType,
    gate_up: Vec<(u32, GroupedConfig)>,
    down: Vec<(u32, GroupedConfig)>,
}

impl Layer {
    /// The family defaults of a layer (`moe::defaults::default_routes`, buckets ascending).
    fn family_default(
        family: Family,
        a_type: AType,
        shape: &MoeShape,
        experts_total: u32,
        sm_count: u32,
    ) -> Result<Self, String> {
        let routes =
            crate::moe::defaults::default_routes(family, a_type, shape, experts_total, sm_count)?;
        let of = |op| routes.iter().filter(|r| r.0 == op).map(|r| (r.1, r.2)).collect();
        Ok(Layer { shape: *shape, a_type, gate_up: of(MoeOp::GateUp), down: of(MoeOp::Down) })
    }
}

/// The grouped routes of a dispatch table, GPU-free; with a kernel family, the family defaults
/// (`moe::defaults`) of every layer the table has no entries for.
#[derive(Debug, Clone, PartialEq)]
pub struct MoeRouteTable {
    layers: Vec<Layer>,
    stale_templates: bool,
    /// (family, SMs) of the device whose defaults serve the other layers; `None`: no defaults.
    defaults: Option<(Family, u32)>,
}

impl MoeRouteTable {
    /// The table's `moe` entries per (layer shape, activation type), in the table's order of
    /// first appearance; `stale_templates` when the table's grouped template hash is not this
    /// build's.
    pub fn new(table: &Table) -> Self {
        let mut layers: Vec<Layer> = Vec::new();
        for e in &table.moe {
            let (shape, a_type) = (e.key.shape(), e.key.a_type);
            let i = match layers.iter().position(|l| l.shape == shape && l.a_type == a_type) {
                Some(i) => i,
                None => {
                    layers.push(Layer { shape, a_type, gate_up: vec![], down: vec![] });
                    layers.len() - 1
                }
            };
            let list = match e.key.op {
                MoeOp::GateUp => &mut layers[i].gate_up,
                MoeOp::Down => &mut layers[i].down,
            };
            list.push((e.key.tokens, e.config));
        }
        for l in &mut layers {
            l.gate_up.sort_by_key(|(b, _)| *b);
            l.down.sort_by_key(|(b, _)| *b);
        }
        MoeRouteTable { layers, stale_templates: table.moe_templates_stale(), defaults: None }
    }

    /// The routes a dispatcher on a device of `family` with `sm_count` SMs launches: the table's
    /// grouped entries when they are of `family` (a table's entries are all of one device), and
    /// the family defaults of every other layer.
    pub fn with_defaults(table: Option<&Table>, family: Family, sm_count: u32) -> Self {
        let mut routes = own_grouped(table, family).map_or(
            MoeRouteTable { layers: Vec::new(), stale_templates: false, defaults: None },
            Self::new,
        );
        routes.defaults = Some((family, sm_count));
        routes
    }

    /// The routes of one layer's family defaults alone, built once (`moe::defaults`): the
    /// configurations a dispatcher whose table has no entries for the layer launches, picked per
    /// token count as [`Self::route`] picks (routes of it name the defaults as a table's
    /// entries); the error of `moe::defaults::default_routes` where the family has no kernel for
    /// the layer.
    pub fn of_defaults(
        family: Family,
        a_type: AType,
        shape: &MoeShape,
        experts_total: u32,
        sm_count: u32,
    ) -> Result<Self, String> {
        let layer = Layer::family_default(family, a_type, shape, experts_total, sm_count)?;
        Ok(MoeRouteTable { layers: vec![layer], stale_templates: false, defaults: None })
    }

    /// (layer shape, activation type) of every layer with grouped entries.
    pub fn layers(&self) -> Vec<(MoeShape, AType)> {
        self.layers.iter().map(|l| (l.shape, l.a_type)).collect()
    }

    /// The kernels the layer `shape` of a model of `experts_total` routed experts (`shape.experts`
    /// when every expert is local) with activations `a_type` launches for `tokens`, and why. A
    /// layer the table has no grouped entries for takes the family defaults where the routes
    /// have them (`with_defaults`; `experts_total` sets their rows per expert); else, and for an
    /// activation type or op the table lacks for a layer it has, the route is an error naming
    /// the table's layers, and grouped launches of it are refused too.
    pub fn route(
        &self,
        shape: &MoeShape,
        experts_total: u32,
        a_type: AType,
        tokens: u32,
    ) -> Result<MoeLayerRoute, RuntimeError> {
        if tokens == 0 {
            return Err(RuntimeError::InvalidArgument("a grouped route needs tokens >= 1".into()));
        }
        crate::moe::defaults::check_experts_total(shape, experts_total)
            .map_err(RuntimeError::InvalidArgument)?;
        let tabled = self
            .layers
            .iter()
            .find(|l| l.shape == *shape && l.a_type == a_type)
            .filter(|l| !l.gate_up.is_empty() && !l.down.is_empty());
        let default;
        // a layer of the table runs its entries only (an activation type it lacks stays refused)
        let of_table = self.layers.iter().any(|l| l.shape == *shape);
        let (layer, family_default) = match (tabled, self.defaults) {
            (Some(l), _) => (l, false),
            (None, Some((family, sm_count))) if !of_table => {
                default = Layer::family_default(family, a_type, shape, experts_total, sm_count)
                    .map_err(|why| {
                        RuntimeError::InvalidArgument(format!("no grouped route: {why}"))
                    })?;
                (&default, true)
            }
            (None, _) => {
                return Err(RuntimeError::InvalidArgument(format!(
                    "no grouped route: the table has no {a_type} grouped gate_up and down entries \
                     for the layer {shape} (it has: {})",
                    self.describe_layers()
                )))
            }
        };
        let stale = self.stale_templates && !family_default;
        let pick = |op, list: &[(u32, GroupedConfig)]| MoeRoute {
            family_default,
            ..MoeRoute::pick(op, a_type, shape, list, tokens, stale)
        };
        Ok(MoeLayerRoute {
            shape: *shape,
            a_type,
            gate_up: pick(MoeOp::GateUp, &layer.gate_up),
            down: pick(MoeOp::Down, &layer.down),
        })
    }

    fn describe_layers(&self) -> String {
        if self.layers.is_empty() {
            return "none".into();
        }
        let v: Vec<String> =
            self.layers.iter().map(|l| format!("{} {}", l.a_type, l.shape)).collect();
        v.join("; ")
    }

    /// One line per layer for the start-up report: its buckets per op and how many distinct
    /// kernels they name; with defaults, a last line saying what the other layers run.
    pub fn summary(&self) -> Vec<String> {
        let buckets = |list: &[(u32, GroupedConfig)]| {
            let v: Vec<String> = list.iter().map(|(b, _)| b.to_string()).collect();
            v.join(", ")
        };
        let others = self.defaults.map(|(family, _)| {
            format!(
                "grouped MoE layers outside the table: the {family} family defaults, built by each \
                 layer's first workspace"
            )
        });
        self.layers
            .iter()
            .map(|l| {
                let mut configs: Vec<GroupedConfig> = Vec::new();
                for (_, c) in l.gate_up.iter().chain(&l.down) {
                    if !configs.contains(c) {
                        configs.push(*c);
                    }
                }
                format!(
                    "grouped MoE {} {}: gate_up at B = {}; down at B = {} ({} kernels{})",
                    l.a_type,
                    l.shape,
                    buckets(&l.gate_up),
                    buckets(&l.down),
                    configs.len(),
                    if self.stale_templates { ", tuned with other grouped templates" } else { "" }
                )
            })
            .chain(others)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::template::{default_config, Family};

    /// The committed H200 table's W4A16 grouped entries at B = 1, 8, 64, 256 only (both ops), with
    /// this build's grouped template hash.
    fn table() -> Table {
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../results/nvidia-h200.ron");
        let mut t = Table::load(&path).unwrap_or_else(|e| panic!("{e}"));
        t.moe.retain(|e| {
            e.key.a_type == crate::problem::AType::Bf16 && [1, 8, 64, 256].contains(&e.key.tokens)
        });
        assert_eq!(t.moe.len(), 8, "both ops at B = 1, 8, 64, 256 in {}", path.display());
        t.moe_template_hash = Some(crate::moe::templates::template_hash());
        t
    }

    fn entry(t: &Table, op: MoeOp, tokens: u32) -> GroupedConfig {
        t.moe.iter().find(|e| e.key.op == op && e.key.tokens == tokens).unwrap().config
    }

    const TP8: MoeShape = MoeShape::GLM5_TP8;

    #[test]
    fn grouped_routes_name_the_bucket_and_why() {
        let t = table();
        let routes = MoeRouteTable::new(&t);
        assert_eq!(routes.layers(), vec![(TP8, AType::Bf16)]);
        let at = |tokens| routes.route(&TP8, 256, AType::Bf16, tokens).unwrap();
        // A tuned bucket.
        let r = at(8);
        assert_eq!((r.gate_up.bucket, r.gate_up.kind), (8, MoeRouteKind::Exact));
        assert_eq!(r.gate_up.config, entry(&t, MoeOp::GateUp, 8));
        assert_eq!(r.down.config, entry(&t, MoeOp::Down, 8));
        // Between 8 and 64: ln 20 is nearer ln 8 than ln 64; 23 is nearer 64 (sqrt(8 * 64) = 22.6).
        let r = at(20);
        assert_eq!(r.gate_up.bucket, 8);
        assert_eq!(r.gate_up.kind, MoeRouteKind::Between { lower: 8, upper: 64 });
        assert_eq!(r.down.config, entry(&t, MoeOp::Down, 8));
        let r = at(23);
        assert_eq!((r.down.bucket, r.down.config), (64, entry(&t, MoeOp::Down, 64)));
        assert_eq!(r.down.kind, MoeRouteKind::Between { lower: 8, upper: 64 });
        // Beyond the largest bucket.
        let r = at(4096);
        assert_eq!((r.gate_up.bucket, r.gate_up.kind), (256, MoeRouteKind::AboveLargest));
        assert_eq!(r.gate_up.config, entry(&t, MoeOp::GateUp, 256));
        // The text says all of it, op by op.
        let text = at(20).to_string();
        assert!(text.starts_with("w4a16: gate_up "), "{text}");
        assert!(
            text.contains(
                "(nearest bucket B=8: 20 lies between B=8 and B=64, nearer in log scale)"
            ),
            "{text}"
        );
        assert!(text.contains("; down "), "{text}");
        assert!(text.contains(&entry(&t, MoeOp::Down, 8).name()), "{text}");
        assert!(at(1).to_string().contains("(exact)"), "{}", at(1));
        let text = at(4096).to_string();
        assert!(text.contains("nearest bucket B=256: 4096 is above the largest tuned B"), "{text}");
        assert!(!text.contains("other grouped templates"), "{text}");
    }

    /// An sm120 gate_up split along K says up to how many tiles its CTAs split (the workspace's
    /// room for it); a kernel without split-K says nothing of it.
    #[test]
    fn an_sm120_split_kernel_says_when_it_splits() {
        let mut t = table();
        let space =
            crate::moe::space::search_space_for(Family::Sm120, AType::Nvfp4, MoeOp::GateUp, &TP8);
        let split = *space.iter().find(|c| c.split_k == 4 && c.block_m == 8).unwrap();
        let down =
            crate::moe::space::search_space_for(Family::Sm120, AType::Nvfp4, MoeOp::Down, &TP8)[0];
        for e in &mut t.moe {
            e.key.family = Family::Sm120;
            e.key.a_type = AType::Nvfp4;
            e.config = if e.key.op == MoeOp::GateUp { split } else { down };
        }
        t.moe_template_hash = Some(crate::moe::templates::family_template_hash(Family::Sm120));
        let routes = MoeRouteTable::new(&t);
        let r = routes.route(&TP8, 256, AType::Nvfp4, 1).unwrap();
        // 128 routed-row slots at split 4: 16 tiles of 8 rows
        assert_eq!((r.gate_up.split_room, r.down.split_room), (16, 0));
        let text = r.to_string();
        assert!(
            text.contains("; K over 4 CTAs when the step has at most 16 tiles of 8 routed rows)"),
            "{text}"
        );
        assert_eq!(text.matches("K over").count(), 1, "{text}");
    }

    #[test]
    fn below_the_smallest_bucket_and_stale_templates_are_said() {
        let mut t = table();
        t.moe.retain(|e| e.key.tokens >= 8);
        t.moe_template_hash = Some("0".repeat(64));
        let routes = MoeRouteTable::new(&t);
        let r = routes.route(&TP8, 256, AType::Bf16, 2).unwrap();
        assert_eq!((r.gate_up.bucket, r.gate_up.kind), (8, MoeRouteKind::BelowSmallest));
        assert!(r.gate_up.stale_templates && r.down.stale_templates);
        let text = r.to_string();
        assert!(text.contains("nearest bucket B=8: 2 is below the smallest tuned B"), "{text}");
        assert!(
            text.contains("; tuned with other grouped templates, built from this build's)"),
            "{text}"
        );
        assert!(routes.summary()[0].contains("tuned with other grouped templates"));
    }

    /// The route is the bucket `nearest_bucket` picks, the function grouped launches pick their
    /// kernel with, at every token count; its kind agrees with where B lies.
    #[test]
    fn the_route_is_the_bucket_the_launch_picks_at_every_token_count() {
        let t = table();
        let routes = MoeRouteTable::new(&t);
        let buckets = [1u32, 8, 64, 256];
        for tokens in 1..=5000u32 {
            let r = routes.route(&TP8, 256, AType::Bf16, tokens).unwrap();
            let want = buckets[nearest_bucket(buckets.iter().copied(), tokens)];
            for op in [r.gate_up, r.down] {
                assert_eq!(op.bucket, want, "B={tokens}");
                assert_eq!(op.config, entry(&t, op.op, want), "B={tokens}");
                match op.kind {
                    MoeRouteKind::Exact => assert_eq!(tokens, want),
                    MoeRouteKind::Between { lower, upper } => {
                        assert!(lower < tokens && tokens < upper, "B={tokens}: {op}");
                        assert!(want == lower || want == upper);
                    }
                    MoeRouteKind::AboveLargest => assert!(tokens > 256),
                    MoeRouteKind::BelowSmallest => unreachable!("B >= 1 is never below bucket 1"),
                }
            }
        }
    }

    #[test]
    fn a_layer_without_grouped_entries_is_refused_naming_the_layers_there_are() {
        let t = table();
        let routes = MoeRouteTable::new(&t);
        let e = routes.route(&MoeShape::GLM5_EP8, 256, AType::Bf16, 8).unwrap_err().to_string();
        assert!(e.contains("no grouped route"), "{e}");
        assert!(e.contains(&MoeShape::GLM5_EP8.to_string()), "{e}");
        assert!(e.contains(&format!("it has: w4a16 {TP8}")), "{e}");
        let e = routes.route(&TP8, 256, AType::Nvfp4, 8).unwrap_err().to_string();
        assert!(e.contains("no w4a4 grouped"), "{e}");
        assert!(routes.route(&TP8, 256, AType::Bf16, 0).is_err());
        // Only gate_up entries: no route either (the layer cannot run).
        let mut half = t.clone();
        half.moe.retain(|e| e.key.op == MoeOp::GateUp);
        let e = MoeRouteTable::new(&half).route(&TP8, 256, AType::Bf16, 8).unwrap_err().to_string();
        assert!(e.contains("gate_up and down"), "{e}");
        // A table without grouped entries.
        let mut none = t;
        none.moe.clear();
        let routes = MoeRouteTable::new(&none);
        assert!(routes.layers().is_empty() && routes.summary().is_empty());
        let e = routes.route(&TP8, 256, AType::Bf16, 8).unwrap_err().to_string();
        assert!(e.contains("it has: none"), "{e}");
    }

    #[test]
    fn the_summary_lists_buckets_and_distinct_kernels_per_layer() {
        let t = table();
        let s = MoeRouteTable::new(&t).summary();
        assert_eq!(s.len(), 1);
        let distinct = {
            let mut v: Vec<GroupedConfig> = t.moe.iter().map(|e| e.config).collect();
            v.sort_by_key(|c| c.name());
            v.dedup();
            v.len()
        };
        assert!(
            s[0].starts_with(&format!(
                "grouped MoE w4a16 {TP8}: gate_up at B = 1, 8, 64, 256; down at B = 1, 8, 64, 256 ({distinct} kernels"
            )),
            "{}",
            s[0]
        );
    }

    /// A layer the table has no entries for takes the family defaults (its route says so); a
    /// table of another family's entries serves no layer; without defaults (a table read alone)
    /// such a layer has no route and the error names the table's layers.
    #[test]
    fn layers_outside_the_table_take_the_family_defaults() {
        let t = table();
        let ep8 = MoeShape::GLM5_EP8;
        let e = MoeRouteTable::new(&t).route(&ep8, 256, AType::Bf16, 8).unwrap_err().to_string();
        assert!(e.contains("no grouped route") && e.contains(&TP8.to_string()), "{e}");
        let routes = MoeRouteTable::with_defaults(Some(&t), Family::Sm90, 132);
        let tuned = routes.route(&TP8, 256, AType::Bf16, 8).unwrap();
        assert!(!tuned.gate_up.family_default && !tuned.to_string().contains("family default"));
        let defaults =
            crate::moe::defaults::default_routes(Family::Sm90, AType::Bf16, &ep8, 256, 132)
                .unwrap();
        for tokens in [1, 3, 8, 100, 5000] {
            let r = routes.route(&ep8, 256, AType::Bf16, tokens).unwrap();
            assert!(r.gate_up.family_default && r.down.family_default, "{r}");
            assert!(r.to_string().contains("family default: the table has no entry"), "{r}");
            let of = |op| {
                let list: Vec<_> = defaults.iter().filter(|d| d.0 == op).collect();
                list[nearest_bucket(list.iter().map(|d| d.1), tokens)].2
            };
            assert_eq!((r.gate_up.config, r.down.config), (of(MoeOp::GateUp), of(MoeOp::Down)));
        }
        // the model's routed experts set the defaults' rows per expert: GLM-5's 256 route each of
        // an EP8 GPU's 32 experts B / 32 rows; counted as 32 they would be 8 times as many
        let model = routes.route(&ep8, 256, AType::Bf16, 64).unwrap();
        let local = routes.route(&ep8, 32, AType::Bf16, 64).unwrap();
        assert!(!model.gate_up.config.tiled && local.gate_up.config.tiled, "{model} / {local}");
        let e = routes.route(&ep8, 31, AType::Bf16, 8).unwrap_err().to_string();
        assert!(e.contains("fewer than the layer's 32 local experts"), "{e}");
        let far = routes.route(&ep8, 256, AType::Bf16, 5000).unwrap().to_string();
        assert!(
            far.contains("nearest bucket B=4096: 5000 is above the largest default B"),
            "{far}"
        );
        // a layer of the table keeps to its entries: the W4A4 it lacks stays refused
        let e = routes.route(&TP8, 256, AType::Nvfp4, 8).unwrap_err().to_string();
        assert!(e.contains("no grouped route") && e.contains("w4a4"), "{e}");
        // the H200 table on an SM120 GPU: every layer on sm120's defaults, W4A4 only
        let sm120 = MoeRouteTable::with_defaults(Some(&t), Family::Sm120, 188);
        assert!(sm120.layers().is_empty());
        let r = sm120.route(&TP8, 256, AType::Nvfp4, 8).unwrap();
        assert_eq!((r.gate_up.config.family, r.gate_up.family_default), (Family::Sm120, true));
        let e = sm120.route(&TP8, 256, AType::Bf16, 8).unwrap_err().to_string();
        assert!(e.contains("no sm120 w4a16 grouped kernel"), "{e}");
        // no table at all
        let none = MoeRouteTable::with_defaults(None, Family::Sm90, 132);
        assert!(none.route(&TP8, 256, AType::Nvfp4, 1).unwrap().down.family_default);
    }

    #[test]
    fn gemm_routes_read_as_kernel_and_reason() {
        let config = default_config(Family::Sm90, AType::Bf16);
        let route = |method, kind| Route { config, method, kind }.to_string();
        assert_eq!(
            route(Method::Fused, RouteKind::NearestBucket { bucket: 16 }),
            format!("{} (nearest bucket M=16)", config.name())
        );
        assert_eq!(
            route(Method::DequantCublasBf16, RouteKind::Exact),
            "dequant_cublas_bf16 (exact)"
        );
        assert!(route(Method::Fused, RouteKind::Common)
            .ends_with("(not in the table: common configuration)"));
        assert!(route(Method::Fused, RouteKind::Default)
            .ends_with("(not in the table: family default)"));
    }
}
