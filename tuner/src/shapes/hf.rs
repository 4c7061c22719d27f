//! Derivation of shape sets from a Hugging Face MoE `config.json` (GLM-5, DeepSeek-V2/V3, GLM-4.5,
//! Qwen2/Qwen3-MoE, Qwen3-Next, Mixtral), with the sharding rules of the module docs.
//!
//! Keys read, per `model_type`:
//! - `glm_moe_dsa`, `deepseek_v3`, `deepseek_v2`, `glm4_moe`: `hidden_size`, `moe_intermediate_size`,
//!   `n_routed_experts`, `n_shared_experts` (null or 0: none; the shared expert is one MLP of
//!   `moe_intermediate_size * n_shared_experts`), `num_experts_per_tok`, `num_hidden_layers`,
//!   `first_k_dense_replace`, `moe_layer_freq` (optional, default 1; layer i is MoE when
//!   `i >= first_k_dense_replace && i % moe_layer_freq == 0`), and `intermediate_size` for the dense
//!   layers when there are any.
//! - `qwen3_moe`, `qwen2_moe`, `qwen3_next`: `hidden_size`, `moe_intermediate_size`, `num_experts`,
//!   `num_experts_per_tok`, `num_hidden_layers`, `decoder_sparse_step` (optional, default 1),
//!   `mlp_only_layers` (optional, default none; layer i is MoE when it is not listed and
//!   `(i + 1) % decoder_sparse_step == 0`), `shared_expert_intermediate_size` (`qwen2_moe` and
//!   `qwen3_next` only, required; 0: no shared expert, as the serving engines read it; `qwen3_moe`
//!   layers have none), and `intermediate_size` for dense layers when there are any.
//! - `mixtral`: `hidden_size`, `intermediate_size` (the expert size), `num_local_experts`,
//!   `num_experts_per_tok`, `num_hidden_layers`; every layer is MoE, no shared expert.

use super::error::{ParallelismReason, ShapeError};
use super::{
    default_token_buckets, GemmShape, Op, Parallelism, Routing, ShapeFile, ShapeSet, MAX_DIM,
    MAX_EXPERTS, MAX_EXPERTS_PER_TOKEN, MAX_LAYERS, SCHEMA_VERSION,
};
use serde::de::{Deserialize, Deserializer, Error as _, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};
use std::collections::HashSet;
use std::path::Path;

/// The `model_type` values [`HfMoeConfig::from_json`] understands.
pub const SUPPORTED_MODEL_TYPES: &[&str] = &[
    "glm_moe_dsa",
    "deepseek_v3",
    "deepseek_v2",
    "glm4_moe",
    "qwen3_moe",
    "qwen2_moe",
    "qwen3_next",
    "mixtral",
];

/// One MLP kind of the model: its intermediate size and the config key it came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MlpSize {
    /// Intermediate size I of the unsplit MLP.
    pub intermediate: u32,
    /// Where I came from, for error messages (e.g. "moe_intermediate_size").
    pub key: &'static str,
}

/// The MLP structure of a MoE model as its `config.json` describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HfMoeConfig {
    /// The file (or label) the config was read from.
    pub origin: String,
    pub model_type: String,
    /// `_name_or_path`, else `architectures[0]`, else the model type.
    pub model: String,
    pub hidden_size: u32,
    /// One routed expert.
    pub routed: MlpSize,
    pub routing: Routing,
    /// The shared expert(s) fused into one MLP, if the model has one.
    pub shared: Option<MlpSize>,
    /// The dense MLP of non-MoE layers, if the model has such layers.
    pub dense: Option<MlpSize>,
    /// Layers with a MoE block.
    pub moe_layers: u32,
    /// Layers with a dense MLP.
    pub dense_layers: u32,
    /// Derived sets leave the dense MLP's shapes out ([`HfMoeConfig::moe_only`]).
    pub moe_only: bool,
}

/// A JSON value for an error message: a long one (a list of a million layers) by its start.
fn brief(value: &Value) -> String {
    let text = value.to_string();
    if text.len() <= 120 {
        return text;
    }
    let cut = (0..=117).rev().find(|&i| text.is_char_boundary(i)).unwrap_or(0);
    format!("{}...", &text[..cut])
}

/// Typed access to the keys of a config object, with errors naming the key and the file.
struct Keys<'a> {
    obj: &'a Map<String, Value>,
    origin: &'a str,
    model_type: &'a str,
}

impl Keys<'_> {
    fn missing(&self, key: &str) -> ShapeError {
        ShapeError::MissingKey {
            origin: self.origin.to_string(),
            model_type: self.model_type.to_string(),
            key: key.to_string(),
        }
    }

    fn bad(&self, key: &str, expected: &'static str, found: &Value) -> ShapeError {
        ShapeError::BadValue {
            origin: self.origin.to_string(),
            key: key.to_string(),
            expected,
            found: brief(found),
        }
    }

    /// A non-negative integer that fits u32; absent or null gives None.
    fn opt_u32(&self, key: &str) -> Result<Option<u32>, ShapeError> {
        match self.obj.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v
                .as_u64()
                .and_then(|x| u32::try_from(x).ok())
                .map(Some)
                .ok_or_else(|| self.bad(key, "a non-negative integer below 2^32", v)),
        }
    }

    /// `value` of `key` if it is at most `max`; `expected` names the bound in the error.
    fn at_most(
        &self,
        key: &str,
        value: u32,
        max: u32,
        expected: &'static str,
    ) -> Result<u32, ShapeError> {
        if value > max {
            return Err(self.bad(key, expected, &Value::from(value)));
        }
        Ok(value)
    }

    /// A required positive size (hidden or intermediate), at most [`MAX_DIM`].
    fn size(&self, key: &str) -> Result<u32, ShapeError> {
        let v = self.positive(key)?;
        self.at_most(key, v, MAX_DIM, "a size of at most 1048576 (2^20)")
    }

    /// A required size where 0 means none (`None`); otherwise as [`Keys::size`].
    fn size_or_none(&self, key: &str) -> Result<Option<u32>, ShapeError> {
        match self.opt_u32(key)? {
            None => Err(self.missing(key)),
            Some(0) => Ok(None),
            Some(_) => self.size(key).map(Some),
        }
    }

    /// A required positive integer.
    fn positive(&self, key: &str) -> Result<u32, ShapeError> {
        match self.opt_u32(key)? {
            None => Err(self.missing(key)),
            Some(0) => Err(self.bad(key, "a positive integer", &Value::from(0))),
            Some(x) => Ok(x),
        }
    }

    /// A key that must be present but may be null (None) or a non-negative integer.
    fn nullable(&self, key: &str) -> Result<Option<u32>, ShapeError> {
        if !self.obj.contains_key(key) {
            return Err(self.missing(key));
        }
        self.opt_u32(key)
    }

    /// An optional positive integer with a default.
    fn positive_or(&self, key: &str, default: u32) -> Result<u32, ShapeError> {
        match self.opt_u32(key)? {
            None => Ok(default),
            Some(0) => Err(self.bad(key, "a positive integer", &Value::from(0))),
            Some(x) => Ok(x),
        }
    }

    /// An optional list of non-negative integers (absent or null: empty).
    fn u32_list(&self, key: &str) -> Result<Vec<u32>, ShapeError> {
        match self.obj.get(key) {
            None | Some(Value::Null) => Ok(Vec::new()),
            Some(v @ Value::Array(items)) => items
                .iter()
                .map(|x| x.as_u64().and_then(|x| u32::try_from(x).ok()))
                .collect::<Option<Vec<u32>>>()
                .ok_or_else(|| self.bad(key, "a list of layer indices", v)),
            Some(v) => Err(self.bad(key, "a list of layer indices", v)),
        }
    }
}

impl HfMoeConfig {
    /// Reads the MLP structure from the text of a `config.json`; `origin` names it in errors.
    pub fn from_json(text: &str, origin: &str) -> Result<HfMoeConfig, ShapeError> {
        // A byte-order mark (left by some editors) is not JSON.
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        let json_error = |e: serde_json::Error| ShapeError::Json {
            origin: origin.to_string(),
            line: e.line(),
            column: e.column(),
            message: e.to_string(),
        };
        // serde_json's Value keeps the last of a key given twice; a config that says two things
        // is refused
        let UniqueKeys(value) = serde_json::from_str(text).map_err(json_error)?;
        let Value::Object(obj) = &value else {
            return Err(ShapeError::BadValue {
                origin: origin.to_string(),
                key: "<top level>".into(),
                expected: "a JSON object",
                found: brief(&value),
            });
        };
        let Some(model_type) = obj.get("model_type").and_then(Value::as_str) else {
            return Err(ShapeError::NoModelType { origin: origin.to_string() });
        };
        if !SUPPORTED_MODEL_TYPES.contains(&model_type) {
            return Err(ShapeError::UnknownModelType {
                origin: origin.to_string(),
                model_type: model_type.to_string(),
            });
        }
        let keys = Keys { obj, origin, model_type };
        let model = obj
            .get("_name_or_path")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .or_else(|| obj.get("architectures")?.as_array()?.first()?.as_str())
            .unwrap_or(model_type)
            .to_string();
        let hidden_size = keys.size("hidden_size")?;
        let num_layers = keys.positive("num_hidden_layers")?;
        let num_layers = keys.at_most(
            "num_hidden_layers",
            num_layers,
            MAX_LAYERS,
            "a layer count of at most 10000",
        )?;
        let experts_per_token = keys.positive("num_experts_per_tok")?;
        let experts_per_token = keys.at_most(
            "num_experts_per_tok",
            experts_per_token,
            MAX_EXPERTS_PER_TOKEN,
            "at most 256 experts per token",
        )?;
        let experts = |key: &str| {
            let n = keys.positive(key)?;
            keys.at_most(key, n, MAX_EXPERTS, "an expert count of at most 65536")
        };

        let (routed, routed_experts, shared, moe_layers) = match model_type {
            "glm_moe_dsa" | "deepseek_v3" | "deepseek_v2" | "glm4_moe" => {
                let key = "moe_intermediate_size";
                let routed = MlpSize { intermediate: keys.size(key)?, key };
                let experts = experts("n_routed_experts")?;
                let shared = match keys.nullable("n_shared_experts")?.unwrap_or(0) {
                    0 => None,
                    n => Some(MlpSize {
                        intermediate: routed
                            .intermediate
                            .checked_mul(n)
                            .filter(|&i| i <= MAX_DIM)
                            .ok_or_else(|| {
                                keys.bad(
                                    "n_shared_experts",
                                    "a count whose shared MLP (moe_intermediate_size * \
                                     n_shared_experts) is at most 1048576 (2^20)",
                                    &Value::from(n),
                                )
                            })?,
                        key: "moe_intermediate_size * n_shared_experts",
                    }),
                };
                let first_dense = keys
                    .opt_u32("first_k_dense_replace")?
                    .ok_or_else(|| keys.missing("first_k_dense_replace"))?;
                if first_dense >= num_layers {
                    return Err(keys.bad(
                        "first_k_dense_replace",
                        "less than num_hidden_layers (the layers from it on are the MoE layers)",
                        &Value::from(first_dense),
                    ));
                }
                let freq = keys.positive_or("moe_layer_freq", 1)?;
                let moe = (0..num_layers).filter(|&i| i >= first_dense && i % freq == 0).count();
                (routed, experts, shared, moe as u32)
            }
            "qwen3_moe" | "qwen2_moe" | "qwen3_next" => {
                let key = "moe_intermediate_size";
                let routed = MlpSize { intermediate: keys.size(key)?, key };
                let experts = experts("num_experts")?;
                // Qwen2-MoE and Qwen3-Next layers hold a shared expert of this size (the serving
                // engines skip it at 0); a config without the key would get the library's default,
                // which this derivation does not guess. Qwen3-MoE layers never hold one.
                let key = "shared_expert_intermediate_size";
                let shared = if model_type == "qwen3_moe" {
                    None
                } else {
                    keys.size_or_none(key)?.map(|intermediate| MlpSize { intermediate, key })
                };
                let step = keys.positive_or("decoder_sparse_step", 1)?;
                // A set: one pass over the layers, one lookup each (a list scan per layer was
                // layers x list long).
                let mlp_only: HashSet<u32> =
                    keys.u32_list("mlp_only_layers")?.into_iter().collect();
                // a layer past the model's is a typo, not a rule to ignore
                if let Some(&i) = mlp_only.iter().filter(|&&i| i >= num_layers).min() {
                    return Err(keys.bad(
                        "mlp_only_layers",
                        "layer indices below num_hidden_layers",
                        &Value::from(i),
                    ));
                }
                let moe = (0..num_layers)
                    .filter(|i| !mlp_only.contains(i) && (i + 1) % step == 0)
                    .count();
                (routed, experts, shared, moe as u32)
            }
            "mixtral" => {
                let key = "intermediate_size";
                let routed = MlpSize { intermediate: keys.size(key)?, key };
                (routed, experts("num_local_experts")?, None, num_layers)
            }
            other => {
                return Err(ShapeError::UnknownModelType {
                    origin: origin.to_string(),
                    model_type: other.to_string(),
                })
            }
        };
        if moe_layers == 0 {
            // the layer rules' own keys (moe_layer_freq, decoder_sparse_step, mlp_only_layers)
            // leave no MoE layer among these
            return Err(keys.bad(
                "num_hidden_layers",
                "a count of layers of which the config's layer rules (moe_layer_freq, \
                 decoder_sparse_step, mlp_only_layers) make at least one MoE",
                &Value::from(num_layers),
            ));
        }
        let dense_layers = num_layers - moe_layers;
        let dense = if dense_layers > 0 {
            let key = "intermediate_size";
            Some(MlpSize { intermediate: keys.size(key)?, key })
        } else {
            None
        };
        Ok(HfMoeConfig {
            origin: origin.to_string(),
            model_type: model_type.to_string(),
            model,
            hidden_size,
            routed,
            routing: Routing { routed_experts, experts_per_token },
            shared,
            dense,
            moe_layers,
            dense_layers,
            moe_only: false,
        })
    }

    /// The same config, deriving the MoE layers' shapes (routed and shared experts) alone:
    /// `fp4tune shapes --moe-only`, for a model whose dense layers do not shard into NVFP4 blocks
    /// at the parallelism wanted (the `source` of derived files says they are left out).
    pub fn moe_only(self) -> Self {
        HfMoeConfig { moe_only: true, ..self }
    }

    /// Reads and parses the `config.json` at `path`.
    pub fn load(path: &Path) -> Result<HfMoeConfig, ShapeError> {
        let text = crate::fsio::read_input(path)
            .map_err(|error| ShapeError::Read { path: path.to_path_buf(), error })?;
        HfMoeConfig::from_json(&text, &path.display().to_string())
    }

    /// The shape set of one GPU under `parallelism`, named [`Parallelism::set_name`].
    pub fn shape_set(
        &self,
        parallelism: Parallelism,
        token_buckets: &[u32],
    ) -> Result<ShapeSet, ShapeError> {
        let Parallelism { tp, ep } = parallelism;
        let fail = |reason| ShapeError::Parallelism { origin: self.origin.clone(), tp, ep, reason };
        if tp == 0 {
            return Err(fail(ParallelismReason::ZeroTp));
        }
        if ep == 0 {
            return Err(fail(ParallelismReason::ZeroEp));
        }
        if tp % ep != 0 {
            return Err(fail(ParallelismReason::EpNotDividingTp));
        }
        let experts = self.routing.routed_experts;
        if experts % ep != 0 {
            return Err(fail(ParallelismReason::EpNotDividingExperts { experts }));
        }
        let moe_tp = tp / ep;
        // gate_up (N = 2I/moe_tp, K = H) and down (N = H, K = I/moe_tp) of one MLP kind.
        let pair = |mlp: MlpSize, ops: (Op, Op), count: u32, layers: u32| {
            if mlp.intermediate % moe_tp != 0 {
                return Err(fail(ParallelismReason::TpNotDividing {
                    key: mlp.key,
                    size: mlp.intermediate,
                    moe_tp,
                }));
            }
            let part = mlp.intermediate / moe_tp;
            let gate_up_n = part.checked_mul(2).ok_or_else(|| ShapeError::BadValue {
                origin: self.origin.clone(),
                key: mlp.key.to_string(),
                expected: "an intermediate size below 2^31",
                found: mlp.intermediate.to_string(),
            })?;
            let shape = |op: Op, n, k| GemmShape {
                name: op.as_str().to_string(),
                op,
                n,
                k,
                count_per_layer: count,
                layers,
            };
            Ok([shape(ops.0, gate_up_n, self.hidden_size), shape(ops.1, self.hidden_size, part)])
        };
        let mut shapes = Vec::with_capacity(6);
        if self.moe_layers > 0 {
            let ops = (Op::RoutedGateUp, Op::RoutedDown);
            shapes.extend(pair(self.routed, ops, experts / ep, self.moe_layers)?);
            if let Some(shared) = self.shared {
                let ops = (Op::SharedGateUp, Op::SharedDown);
                shapes.extend(pair(shared, ops, 1, self.moe_layers)?);
            }
        }
        let moe_shapes = shapes.len();
        if let Some(dense) = self.dense.filter(|_| !self.moe_only) {
            let ops = (Op::DenseGateUp, Op::DenseDown);
            shapes.extend(pair(dense, ops, 1, self.dense_layers)?);
        }
        let set = ShapeSet {
            name: parallelism.set_name(),
            parallelism,
            routing: self.routing,
            shapes,
            token_buckets: token_buckets.to_vec(),
        };
        set.validate().map_err(|(at, reason)| {
            // the MoE layers alone are valid: the dense layers are at fault
            let moe = ShapeSet { shapes: set.shapes[..moe_shapes].to_vec(), ..set.clone() };
            let origin = self.origin.clone();
            if moe_shapes < set.shapes.len() && moe.validate().is_ok() {
                ShapeError::DenseLayers { origin, at, reason }
            } else {
                ShapeError::Invalid { origin, at, reason }
            }
        })?;
        Ok(set)
    }

    /// A shape file with one set per parallelism, in the given order.
    pub fn shape_file(
        &self,
        parallelisms: &[Parallelism],
        token_buckets: &[u32],
    ) -> Result<ShapeFile, ShapeError> {
        let sets = parallelisms
            .iter()
            .map(|&p| self.shape_set(p, token_buckets))
            .collect::<Result<Vec<_>, _>>()?;
        let file = ShapeFile {
            schema_version: SCHEMA_VERSION,
            model: self.model.clone(),
            source: self.describe(),
            sets,
        };
        file.validate(&self.origin)?;
        Ok(file)
    }

    /// The `source` string of derived files: the file and every number read from it.
    fn describe(&self) -> String {
        let mut s = format!(
            "derived by fp4tune from {} (model_type {}): hidden_size {}, {} {}, {} routed experts, \
             {} per token",
            self.origin,
            self.model_type,
            self.hidden_size,
            self.routed.key,
            self.routed.intermediate,
            self.routing.routed_experts,
            self.routing.experts_per_token,
        );
        if let Some(shared) = self.shared {
            s += &format!(", shared expert {} {}", shared.key, shared.intermediate);
        }
        s += &format!(", {} MoE layers", self.moe_layers);
        if let Some(dense) = self.dense {
            s += &format!(
                ", {} dense layers with {} {}{}",
                self.dense_layers,
                dense.key,
                dense.intermediate,
                if self.moe_only { " (left out: --moe-only)" } else { "" }
            );
        }
        s + "; sharded as SGLang does: every MLP weight split tp/ep ways, routed experts over ep"
    }
}

/// The shape file of one parallelism (default token buckets) for the `config.json` text.
pub fn derive_from_hf_config(
    json_text: &str,
    origin: &str,
    tp: u32,
    ep: u32,
) -> Result<ShapeFile, ShapeError> {
    HfMoeConfig::from_json(json_text, origin)?
        .shape_file(&[Parallelism::new(tp, ep)], &default_token_buckets())
}

/// What `fp4tune shapes --from-config PATH --tp TP [--ep EP] [--moe-only]` prints (EP defaults to
/// 1): the RON text of a shape file with one set, which [`ShapeFile::from_ron_str`] reads back.
pub fn shapes_ron_from_config_file(
    path: &Path,
    tp: u32,
    ep: u32,
    moe_only: bool,
) -> Result<String, ShapeError> {
    let config = HfMoeConfig::load(path)?;
    let config = if moe_only { config.moe_only() } else { config };
    let file = config.shape_file(&[Parallelism::new(tp, ep)], &default_token_buckets())?;
    Ok(file.to_ron_string())
}

/// A JSON value read as serde_json reads a [`Value`], except that an object holding one key
/// twice is an error.
struct UniqueKeys(Value);

impl<'de> Deserialize<'de> for UniqueKeys {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(UniqueKeysVisitor)
    }
}

struct UniqueKeysVisitor;

impl<'de> Visitor<'de> for UniqueKeysVisitor {
    type Value = UniqueKeys;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<UniqueKeys, E> {
        Ok(UniqueKeys(Value::Bool(v)))
    }
    fn visit_i64<E>(self, v: i64) -> Result<UniqueKeys, E> {
        Ok(UniqueKeys(v.into()))
    }
    fn visit_u64<E>(self, v: u64) -> Result<UniqueKeys, E> {
        Ok(UniqueKeys(v.into()))
    }
    fn visit_f64<E>(self, v: f64) -> Result<UniqueKeys, E> {
        Ok(UniqueKeys(v.into()))
    }
    fn visit_str<E>(self, v: &str) -> Result<UniqueKeys, E> {
        Ok(UniqueKeys(Value::String(v.to_string())))
    }
    fn visit_unit<E>(self) -> Result<UniqueKeys, E> {
        Ok(UniqueKeys(Value::Null))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<UniqueKeys, A::Error> {
        let mut items = Vec::new();
        while let Some(UniqueKeys(v)) = seq.next_element()? {
            items.push(v);
        }
        Ok(UniqueKeys(Value::Array(items)))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<UniqueKeys, A::Error> {
        let mut obj = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if obj.contains_key(&key) {
                return Err(A::Error::custom(format!("key `{key}` appears twice in one object")));
            }
            let UniqueKeys(v) = map.next_value()?;
            obj.insert(key, v);
        }
        Ok(UniqueKeys(Value::Object(obj)))
    }
}

#[cfg(test)]
#[path = "hf_tests.rs"]
mod tests;
