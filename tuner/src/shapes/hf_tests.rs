//! Tests of shape sets derived from Hugging Face config.json files: the public MoE fixtures at TP
//! and EP degrees, and every refusal naming the file, the key and the problem.

use super::super::{InvalidReason, GLM5_RON};
use super::*;
use std::path::PathBuf;

fn testdata(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata").join(name)
}

fn fixture(name: &str) -> String {
    std::fs::read_to_string(testdata(name)).unwrap()
}

/// The fixture as a JSON object, edited, back to text.
fn edited(name: &str, edit: impl FnOnce(&mut Map<String, Value>)) -> String {
    let mut v: Value = serde_json::from_str(&fixture(name)).unwrap();
    edit(v.as_object_mut().unwrap());
    v.to_string()
}

fn nk(set: &ShapeSet, op: Op) -> Option<(u32, u32, u32, u32)> {
    set.shape(op).map(|s| (s.n, s.k, s.count_per_layer, s.layers))
}

#[test]
fn glm5_derivation_reproduces_the_embedded_file() {
    let embedded = ShapeFile::from_ron_str(GLM5_RON, "glm5.ron").unwrap();
    let config = HfMoeConfig::load(&testdata("glm5-config.json")).unwrap();
    assert_eq!(config.model, "GlmMoeDsaForCausalLM");
    assert_eq!((config.moe_layers, config.dense_layers), (75, 3));
    let ps: Vec<Parallelism> = embedded.sets.iter().map(|s| s.parallelism).collect();
    assert_eq!(ps.len(), 5);
    let derived = config.shape_file(&ps, &default_token_buckets()).unwrap();
    assert_eq!(derived.schema_version, embedded.schema_version);
    assert_eq!(derived.sets.len(), embedded.sets.len());
    for (d, e) in derived.sets.iter().zip(&embedded.sets) {
        assert_eq!(d.name, e.name);
        assert_eq!(d.parallelism, e.parallelism, "{}", e.name);
        assert_eq!(d.routing, e.routing, "{}", e.name);
        assert_eq!(d.token_buckets, e.token_buckets, "{}", e.name);
        assert_eq!(d.shapes.len(), e.shapes.len(), "{}", e.name);
        for (ds, es) in d.shapes.iter().zip(&e.shapes) {
            assert_eq!(ds, es, "set {}", e.name);
        }
        assert_eq!(d, e);
    }
}

#[test]
fn cli_output_round_trips_and_matches_the_embedded_sets() {
    let embedded = ShapeFile::glm5().unwrap();
    for (tp, ep, name) in [(8, 1, "tp8"), (8, 8, "ep8"), (2, 1, "tp2")] {
        let text =
            shapes_ron_from_config_file(&testdata("glm5-config.json"), tp, ep, false).unwrap();
        let back = ShapeFile::from_ron_str(&text, "stdout").unwrap();
        assert_eq!(back.sets.len(), 1);
        assert_eq!(&back.sets[0], embedded.set(name).unwrap());
        assert_eq!(back.to_ron_string(), text);
        assert!(back.source.contains("glm5-config.json"), "{}", back.source);
    }
}

#[test]
fn deepseek_v3_tp8() {
    let file = derive_from_hf_config(&fixture("deepseek-v3-config.json"), "ds", 8, 1).unwrap();
    let set = &file.sets[0];
    assert_eq!(set.name, "tp8");
    assert_eq!(nk(set, Op::RoutedGateUp), Some((512, 7168, 256, 58)));
    assert_eq!(nk(set, Op::RoutedDown), Some((7168, 256, 256, 58)));
    assert_eq!(nk(set, Op::SharedDown), Some((7168, 256, 1, 58)));
    assert_eq!(nk(set, Op::DenseGateUp), Some((4608, 7168, 1, 3)));
    assert_eq!(nk(set, Op::DenseDown), Some((7168, 2304, 1, 3)));
}

#[test]
fn qwen3_moe_has_no_shared_expert_and_no_dense_layers() {
    let set = derive_from_hf_config(&fixture("qwen3-moe-config.json"), "q", 4, 1).unwrap().sets;
    let set = &set[0];
    assert_eq!(set.shapes.len(), 2);
    assert_eq!(nk(set, Op::RoutedGateUp), Some((384, 2048, 128, 48)));
    assert_eq!(nk(set, Op::RoutedDown), Some((2048, 192, 128, 48)));
    assert_eq!(set.routing, Routing { routed_experts: 128, experts_per_token: 8 });
}

/// Qwen3-Next-80B-A3B: 512 routed experts (top-10) of 2048 x 512 and a shared expert of the
/// same size in every one of its 48 layers; at TP 8 the expert's K of 64 (512 / 8).
#[test]
fn qwen3_next_routes_ten_of_512_experts_beside_a_shared_one() {
    let config = HfMoeConfig::load(&testdata("qwen3-next-config.json")).unwrap();
    assert_eq!((config.moe_layers, config.dense_layers), (48, 0));
    let set = config.shape_set(Parallelism::new(8, 1), &[1, 8]).unwrap();
    assert_eq!(set.routing, Routing { routed_experts: 512, experts_per_token: 10 });
    assert_eq!(nk(&set, Op::RoutedGateUp), Some((128, 2048, 512, 48)));
    assert_eq!(nk(&set, Op::RoutedDown), Some((2048, 64, 512, 48)));
    assert_eq!(nk(&set, Op::SharedGateUp), Some((128, 2048, 1, 48)));
    assert_eq!(nk(&set, Op::DenseGateUp), None);
}

#[test]
fn qwen_mlp_only_layers_sparse_step_and_shared_expert() {
    let text = edited("qwen3-moe-config.json", |o| {
        o.insert("model_type".into(), "qwen2_moe".into());
        o.insert("mlp_only_layers".into(), serde_json::json!([0, 1]));
        o.insert("decoder_sparse_step".into(), 2.into());
        o.insert("shared_expert_intermediate_size".into(), 1024.into());
    });
    let config = HfMoeConfig::from_json(&text, "q").unwrap();
    // Odd layers 1, 3, ..., 47 are MoE (24), minus layer 1 listed as MLP-only.
    assert_eq!((config.moe_layers, config.dense_layers), (23, 25));
    let set = config.shape_set(Parallelism::new(2, 1), &[1, 8]).unwrap();
    assert_eq!(nk(&set, Op::SharedGateUp), Some((1024, 2048, 1, 23)));
    assert_eq!(nk(&set, Op::DenseGateUp), Some((6144, 2048, 1, 25)));
    assert_eq!(nk(&set, Op::DenseDown), Some((2048, 3072, 1, 25)));
    // a listed layer past the model's 48 is refused, naming the key and the index
    let text = edited("qwen3-moe-config.json", |o| {
        o.insert("mlp_only_layers".into(), serde_json::json!([0, 999, 48]));
    });
    let e = HfMoeConfig::from_json(&text, "q.json").unwrap_err().to_string();
    assert!(e.contains("q.json") && e.contains("mlp_only_layers") && e.contains("48"), "{e}");
    // more experts per token than the routing bound (the grouped draw is per token and slot)
    let text = edited("qwen3-moe-config.json", |o| {
        o.insert("num_experts".into(), 65536.into());
        o.insert("num_experts_per_tok".into(), 65536.into());
    });
    let e = HfMoeConfig::from_json(&text, "q.json").unwrap_err().to_string();
    assert!(e.contains("num_experts_per_tok") && e.contains("256"), "{e}");
}

/// Qwen2-MoE and Qwen3-Next configs must size their shared expert (0: none; absent: the
/// library's default, not guessed); a Qwen3-MoE config's key is not read (no shared expert).
#[test]
fn qwen_shared_expert_size_by_model_type() {
    let shared = |text: &str| {
        let config = HfMoeConfig::from_json(text, "q").unwrap();
        nk(&config.shape_set(Parallelism::new(1, 1), &[1]).unwrap(), Op::SharedGateUp)
    };
    for model_type in ["qwen2_moe", "qwen3_next"] {
        let text = edited("qwen3-moe-config.json", |o| {
            o.insert("model_type".into(), model_type.into());
            o.insert("shared_expert_intermediate_size".into(), 0.into());
        });
        assert_eq!(shared(&text), None);
        for value in [None, Some(Value::Null)] {
            let text = edited("qwen3-moe-config.json", |o| {
                o.insert("model_type".into(), model_type.into());
                if let Some(v) = value.clone() {
                    o.insert("shared_expert_intermediate_size".into(), v);
                }
            });
            let e = HfMoeConfig::from_json(&text, "cfg.json").unwrap_err().to_string();
            assert!(e.starts_with("cfg.json: ") && !e.contains('\n'), "{e}");
            assert!(e.contains("shared_expert_intermediate_size"), "{e}");
        }
    }
    let text = edited("qwen3-moe-config.json", |o| {
        o.insert("shared_expert_intermediate_size".into(), 1024.into());
    });
    assert_eq!(shared(&text), None);
}

#[test]
fn mixtral_expert_size_is_intermediate_size() {
    let config = HfMoeConfig::load(&testdata("mixtral-config.json")).unwrap();
    let set = config.shape_set(Parallelism::new(2, 1), &[1]).unwrap();
    assert_eq!(set.shapes.len(), 2);
    assert_eq!(nk(&set, Op::RoutedGateUp), Some((14336, 4096, 8, 32)));
    assert_eq!(nk(&set, Op::RoutedDown), Some((4096, 7168, 8, 32)));
    let ep = config.shape_set(Parallelism::new(8, 8), &[1]).unwrap();
    assert_eq!(ep.name, "ep8");
    assert_eq!(nk(&ep, Op::RoutedGateUp), Some((28672, 4096, 1, 32)));
}

/// GLM-4.5-Air (glm4_moe): 45 MoE layers of 128 experts of 1408 columns, one shared expert,
/// one dense layer of 10944. Over 8 GPUs the routed down projection has K = 176 (a K the
/// grouped tiled kernel's K-tail form takes); the dense layer's 1368 columns per GPU are no
/// whole number of NVFP4 blocks, so that set is refused naming the shape (expert parallelism
/// over the 8 GPUs keeps it whole).
#[test]
fn glm45_air_routed_experts_shard_to_a_k_of_176() {
    let config = HfMoeConfig::load(&testdata("glm-4.5-air-config.json")).unwrap();
    let set = config.shape_set(Parallelism::new(4, 1), &[1]).unwrap();
    assert_eq!(nk(&set, Op::RoutedGateUp), Some((704, 4096, 128, 45)));
    assert_eq!(nk(&set, Op::RoutedDown), Some((4096, 352, 128, 45)));
    let air = testdata("glm-4.5-air-config.json");
    let e = shapes_ron_from_config_file(&air, 8, 1, false).unwrap_err().to_string();
    assert!(e.contains("dense_down") && e.contains("k=1368"), "{e}");
    assert!(e.contains("--moe-only"), "{e}");
    // --moe-only: the routed and shared experts' shapes, the dense layer named as left out
    let text = shapes_ron_from_config_file(&air, 8, 1, true).unwrap();
    let file = ShapeFile::from_ron_str(&text, "air.ron").unwrap();
    let set = &file.sets[0];
    assert_eq!(nk(set, Op::RoutedDown), Some((4096, 176, 128, 45)));
    assert_eq!(nk(set, Op::SharedDown), Some((4096, 176, 1, 45)));
    assert_eq!(nk(set, Op::DenseDown), None);
    assert!(file.source.contains("(left out: --moe-only)"), "{}", file.source);
    // a set that is invalid without its dense layers keeps the plain error
    let bad = HfMoeConfig { hidden_size: 4100, ..config.clone() };
    let e = bad.shape_set(Parallelism::new(8, 8), &[1]).unwrap_err();
    assert!(matches!(e, ShapeError::Invalid { .. }), "{e}");
    // expert parallelism over the 8 GPUs keeps whole experts and replicates the dense layer
    let ep = config.shape_set(Parallelism::new(8, 8), &[1]).unwrap();
    assert_eq!(nk(&ep, Op::RoutedDown), Some((4096, 1408, 16, 45)));
    assert_eq!(nk(&ep, Op::DenseDown), Some((4096, 10944, 1, 1)));
}

#[test]
fn mixed_tp_and_ep() {
    let config = HfMoeConfig::load(&testdata("glm5-config.json")).unwrap();
    let set = config.shape_set(Parallelism::new(8, 2), &[1]).unwrap();
    assert_eq!(set.name, "tp8ep2");
    assert_eq!(nk(&set, Op::RoutedGateUp), Some((1024, 6144, 128, 75)));
    assert_eq!(nk(&set, Op::DenseDown), Some((6144, 3072, 1, 3)));
}

#[test]
fn other_deepseek_family_types_share_the_keys() {
    for mt in ["deepseek_v2", "glm4_moe", "deepseek_v3"] {
        let text = edited("glm5-config.json", |o| {
            o.insert("model_type".into(), mt.into());
            o.insert("n_shared_experts".into(), 2.into());
        });
        let set = &derive_from_hf_config(&text, "c", 1, 1).unwrap().sets[0];
        assert_eq!(nk(set, Op::SharedGateUp), Some((8192, 6144, 1, 75)), "{mt}");
    }
    let text = edited("glm5-config.json", |o| {
        o.insert("n_shared_experts".into(), Value::Null);
        o.insert("moe_layer_freq".into(), 2.into());
    });
    let config = HfMoeConfig::from_json(&text, "c").unwrap();
    assert_eq!(config.shared, None);
    // Layers 3..78 with even index: 4, 6, ..., 76.
    assert_eq!((config.moe_layers, config.dense_layers), (37, 41));
}

#[test]
fn malformed_json_names_file_line_and_column() {
    let err = HfMoeConfig::from_json("{\n  \"model_type\": \"mixtral\",\n  oops\n}", "c.json")
        .unwrap_err();
    let ShapeError::Json { ref origin, line, column, .. } = err else { panic!("{err:?}") };
    assert_eq!((origin.as_str(), line), ("c.json", 3));
    assert!(column > 0);
    assert!(err.to_string().starts_with("c.json:3:"), "{err}");
    let err = HfMoeConfig::from_json("[1, 2]", "c.json").unwrap_err();
    assert!(matches!(err, ShapeError::BadValue { .. }), "{err:?}");
    // a key given twice (JSON readers keep one or the other) is refused, nested objects too
    let text = "{\"model_type\": \"mixtral\",\n \"hidden_size\": 6144,\n \"hidden_size\": 4096}";
    let err = HfMoeConfig::from_json(text, "c.json").unwrap_err();
    assert!(err.to_string().starts_with("c.json:3:"), "{err}");
    assert!(err.to_string().contains("key `hidden_size` appears twice"), "{err}");
    let text = "{\"model_type\": \"mixtral\", \"q\": [{\"a\": 1, \"a\": 2}]}";
    let err = HfMoeConfig::from_json(text, "c.json").unwrap_err();
    assert!(err.to_string().contains("key `a` appears twice"), "{err}");
}

#[test]
fn model_type_errors() {
    let err = HfMoeConfig::from_json("{\"hidden_size\": 8}", "c.json").unwrap_err();
    assert!(matches!(err, ShapeError::NoModelType { .. }), "{err:?}");
    assert!(err.to_string().contains("c.json"));
    let err = HfMoeConfig::from_json("{\"model_type\": \"llama\"}", "c.json").unwrap_err();
    assert!(
        matches!(err, ShapeError::UnknownModelType { ref model_type, .. } if model_type == "llama")
    );
    assert!(err.to_string().contains("glm_moe_dsa"), "{err}");
}

#[test]
fn missing_keys_are_named() {
    let cases = [
        ("glm5-config.json", "hidden_size"),
        ("glm5-config.json", "moe_intermediate_size"),
        ("glm5-config.json", "n_routed_experts"),
        ("glm5-config.json", "n_shared_experts"),
        ("glm5-config.json", "first_k_dense_replace"),
        ("glm5-config.json", "num_experts_per_tok"),
        ("glm5-config.json", "num_hidden_layers"),
        // The dense MLP of the first 3 layers needs it.
        ("glm5-config.json", "intermediate_size"),
        ("qwen3-moe-config.json", "num_experts"),
        ("mixtral-config.json", "num_local_experts"),
        ("mixtral-config.json", "intermediate_size"),
    ];
    for (file, key) in cases {
        let text = edited(file, |o| {
            o.remove(key);
        });
        let err = HfMoeConfig::from_json(&text, file).unwrap_err();
        match &err {
            ShapeError::MissingKey { origin, key: k, .. } => {
                assert_eq!((origin.as_str(), k.as_str()), (file, key))
            }
            other => panic!("{file} without {key}: {other:?}"),
        }
        assert!(err.to_string().contains(key));
    }
    // Without dense layers intermediate_size is not needed.
    let text = edited("glm5-config.json", |o| {
        o.remove("intermediate_size");
        o.insert("first_k_dense_replace".into(), 0.into());
    });
    assert_eq!(HfMoeConfig::from_json(&text, "c").unwrap().dense, None);
}

#[test]
fn bad_values_are_named() {
    let cases: [(&str, Value); 5] = [
        ("hidden_size", "6144".into()),
        ("hidden_size", 0.into()),
        ("moe_intermediate_size", (-1).into()),
        ("n_routed_experts", 2.5.into()),
        ("moe_layer_freq", 0.into()),
    ];
    for (key, value) in cases {
        let text = edited("glm5-config.json", |o| {
            o.insert(key.into(), value.clone());
        });
        let err = HfMoeConfig::from_json(&text, "c.json").unwrap_err();
        assert!(matches!(&err, ShapeError::BadValue { key: k, .. } if k == key), "{err:?}");
        assert!(err.to_string().contains(key), "{err}");
    }
    let text = edited("qwen3-moe-config.json", |o| {
        o.insert("mlp_only_layers".into(), "0,1".into());
    });
    let err = HfMoeConfig::from_json(&text, "q").unwrap_err();
    assert!(matches!(&err, ShapeError::BadValue { key, .. } if key == "mlp_only_layers"));
    // layer rules that leave no MoE layer: named, not derived as a model of 0 MoE layers
    let text = edited("glm5-config.json", |o| {
        o.insert("first_k_dense_replace".into(), 80.into());
    });
    let err = HfMoeConfig::from_json(&text, "g").unwrap_err().to_string();
    assert!(err.contains("first_k_dense_replace") && err.contains("80"), "{err}");
    let text = edited("qwen3-moe-config.json", |o| {
        o.insert("decoder_sparse_step".into(), 1000.into());
    });
    let err = HfMoeConfig::from_json(&text, "q").unwrap_err().to_string();
    assert!(err.contains("num_hidden_layers") && err.contains("at least one MoE"), "{err}");
}

#[test]
fn impossible_parallelism() {
    let glm = HfMoeConfig::load(&testdata("glm5-config.json")).unwrap();
    let mixtral = HfMoeConfig::load(&testdata("mixtral-config.json")).unwrap();
    let reason = |c: &HfMoeConfig, tp, ep| match c.shape_set(Parallelism::new(tp, ep), &[1]) {
        Err(ShapeError::Parallelism { reason, tp: t, ep: e, .. }) => {
            assert_eq!((t, e), (tp, ep));
            reason
        }
        other => panic!("tp={tp} ep={ep}: {other:?}"),
    };
    assert_eq!(reason(&glm, 0, 1), ParallelismReason::ZeroTp);
    assert_eq!(reason(&glm, 8, 0), ParallelismReason::ZeroEp);
    assert_eq!(reason(&glm, 4, 8), ParallelismReason::EpNotDividingTp);
    assert_eq!(reason(&mixtral, 16, 16), ParallelismReason::EpNotDividingExperts { experts: 8 });
    assert_eq!(
        reason(&glm, 3, 1),
        ParallelismReason::TpNotDividing { key: "moe_intermediate_size", size: 2048, moe_tp: 3 }
    );
    // Routed and shared divide, the dense MLP does not.
    let odd_dense = HfMoeConfig {
        dense: Some(MlpSize { intermediate: 12289, key: "intermediate_size" }),
        ..glm.clone()
    };
    assert_eq!(
        reason(&odd_dense, 2, 1),
        ParallelismReason::TpNotDividing { key: "intermediate_size", size: 12289, moe_tp: 2 }
    );
    let msg = glm.shape_set(Parallelism::new(4, 8), &[1]).unwrap_err().to_string();
    assert!(msg.contains("glm5-config.json") && msg.contains("ep must divide tp"), "{msg}");
}

#[test]
fn split_too_fine_for_nvfp4_blocks() {
    // Qwen3-30B-A3B: 768 / 64 = 12 columns per GPU, not a whole NVFP4 block.
    let err =
        derive_from_hf_config(&fixture("qwen3-moe-config.json"), "q.json", 64, 1).unwrap_err();
    match err {
        ShapeError::Invalid { origin, at, reason } => {
            assert_eq!(origin, "q.json");
            assert_eq!(at, "set \"tp64\", shape \"routed_down\"");
            assert_eq!(reason, InvalidReason::KNotBlockMultiple { k: 12 });
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn missing_config_file_is_a_read_error() {
    let err =
        shapes_ron_from_config_file(&testdata("no-such-config.json"), 8, 1, false).unwrap_err();
    assert!(matches!(err, ShapeError::Read { .. }));
    assert!(err.to_string().contains("no-such-config.json"), "{err}");
}

/// num_hidden_layers 4294967295 with a long mlp_only_layers looped layers x list (a hang);
/// sizes of 2^31 were accepted. Inputs are bounded, named in the error, and the derivation
/// is linear.
#[test]
fn huge_counts_and_sizes_are_refused_and_derivation_is_linear() {
    let long: Vec<Value> = (0..200_000u32).map(Value::from).collect();
    let text = edited("qwen3-moe-config.json", |o| {
        o.insert("num_hidden_layers".into(), Value::from(u32::MAX));
        o.insert("mlp_only_layers".into(), Value::Array(long.clone()));
    });
    let e = HfMoeConfig::from_json(&text, "cfg.json").unwrap_err().to_string();
    assert!(e.starts_with("cfg.json: key \"num_hidden_layers\" must be a layer count of at most 10000, found 4294967295"), "{e}");

    // The largest layer count with a list of every odd layer: linear, and right.
    let odd: Vec<Value> = (0..MAX_LAYERS).filter(|i| i % 2 == 1).map(Value::from).collect();
    let text = edited("qwen3-moe-config.json", |o| {
        o.insert("num_hidden_layers".into(), Value::from(MAX_LAYERS));
        o.insert("mlp_only_layers".into(), Value::Array(odd));
    });
    let c = HfMoeConfig::from_json(&text, "cfg.json").unwrap();
    assert_eq!((c.moe_layers, c.dense_layers), (MAX_LAYERS / 2, MAX_LAYERS / 2));

    for (key, value) in [
        ("hidden_size", 1u64 << 31),
        ("moe_intermediate_size", (1 << 20) + 16),
        ("num_experts", 1 << 20),
        ("num_experts_per_tok", 1 << 20),
        ("shared_expert_intermediate_size", 1 << 31),
    ] {
        let text = edited("qwen3-moe-config.json", |o| {
            o.insert("model_type".into(), "qwen2_moe".into());
            o.insert("shared_expert_intermediate_size".into(), 512.into());
            o.insert(key.into(), Value::from(value));
        });
        let e = HfMoeConfig::from_json(&text, "cfg.json").unwrap_err().to_string();
        assert!(e.starts_with(&format!("cfg.json: key {key:?} must be")), "{e}");
        assert!(e.contains("at most") && e.contains(&value.to_string()), "{e}");
    }
    let text = edited("deepseek-v3-config.json", |o| {
        o.insert("n_shared_experts".into(), Value::from(4096));
    });
    let e = HfMoeConfig::from_json(&text, "ds.json").unwrap_err().to_string();
    assert!(e.contains("\"n_shared_experts\"") && e.contains("2^20"), "{e}");
    // A bad long list is named by its start, not printed whole.
    let text = edited("qwen3-moe-config.json", |o| {
        let mut bad = long.clone();
        bad.push(Value::from(-1));
        o.insert("mlp_only_layers".into(), Value::Array(bad));
    });
    let e = HfMoeConfig::from_json(&text, "cfg.json").unwrap_err().to_string();
    assert!(e.len() < 400 && e.contains("mlp_only_layers") && e.ends_with("..."), "{e}");
}

#[test]
fn a_byte_order_mark_is_skipped_and_read_errors_say_the_os_error_once() {
    let text = format!("\u{feff}{}", fixture("qwen3-moe-config.json"));
    assert!(HfMoeConfig::from_json(&text, "bom.json").is_ok());
    let dir = tempfile::tempdir().unwrap();
    let e = HfMoeConfig::load(dir.path()).unwrap_err();
    assert!(std::error::Error::source(&e).is_none());
    let text = format!("{:#}", anyhow::Error::from(e));
    assert_eq!(text.matches("is a folder").count(), 1, "{text}");
    let e = HfMoeConfig::load(&dir.path().join("missing.json")).unwrap_err();
    let text = format!("{:#}", anyhow::Error::from(e));
    assert_eq!(text.matches("os error").count(), 1, "{text}");
}
