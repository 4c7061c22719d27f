//! `fp4tune shapes`: a shape set derived from a Hugging Face MoE config.json.

use anyhow::Result;
use std::path::PathBuf;

#[derive(clap::Args, Debug)]
pub struct ShapesArgs {
    /// The model's config.json (GLM-5, DeepSeek-V2/V3, GLM-4.5, Qwen2/Qwen3-MoE, Qwen3-Next, Mixtral key names).
    #[arg(long)]
    pub from_config: PathBuf,
    /// Tensor-parallel degree (GPUs per replica).
    #[arg(long)]
    pub tp: u32,
    /// Expert-parallel degree (divides --tp); default 1.
    #[arg(long)]
    pub ep: Option<u32>,
    /// Only the MoE layers' shapes (routed and shared experts): for a model whose dense layers do
    /// not shard into NVFP4 blocks at this parallelism.
    #[arg(long)]
    pub moe_only: bool,
}

pub fn run(args: ShapesArgs) -> Result<()> {
    let ShapesArgs { from_config, tp, ep, moe_only } = args;
    let ron =
        fp4tune::shapes::shapes_ron_from_config_file(&from_config, tp, ep.unwrap_or(1), moe_only)?;
    out!("{ron}")
}
