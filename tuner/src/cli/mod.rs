//! The subcommands of the `fp4tune` binary, one file each, and the argument types they share.
//! Only the binary prints and only it uses `anyhow`; the library returns typed errors.

pub mod bench;
pub mod check;
pub mod compile;
pub mod floors;
pub mod merge;
pub mod moe;
pub mod report;
pub mod selftest;
pub mod shapes;
pub mod simulate;
pub mod table;
pub mod tune;

use anyhow::{bail, Result};
use clap::ValueEnum;
use fp4tune::problem::AType;
use fp4tune::template::Arch;

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum ATypeArg {
    W4a4,
    W4a16,
    All,
}

impl ATypeArg {
    /// The one activation type a measuring command runs (`all` is for `compile` only).
    pub fn single(self, command: &str) -> Result<AType> {
        match self {
            ATypeArg::W4a4 => Ok(AType::Nvfp4),
            ATypeArg::W4a16 => Ok(AType::Bf16),
            ATypeArg::All => {
                bail!("--a-type all is not supported by {command}: pick w4a4 or w4a16")
            }
        }
    }

    pub fn types(self) -> Vec<AType> {
        match self {
            ATypeArg::W4a4 => vec![AType::Nvfp4],
            ATypeArg::W4a16 => vec![AType::Bf16],
            ATypeArg::All => vec![AType::Nvfp4, AType::Bf16],
        }
    }
}

pub fn parse_arch(s: &str) -> Result<Arch, String> {
    Arch::parse(s).ok_or_else(|| format!("unknown architecture `{s}` (expected sm_90a or sm_120a)"))
}
