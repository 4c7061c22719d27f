//! The `fp4tune` command line: argument parsing, progress and printing only.
fn main() -> anyhow::Result<()> {
    Ok(())
}
