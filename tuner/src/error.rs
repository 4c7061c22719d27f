//! The crate's umbrella error: each module keeps its own typed error, and every one of them
//! converts into this, so callers that do not care which layer failed can use one type.

/// Any fp4tune library error.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Format(#[from] crate::format::FormatError),
    #[error(transparent)]
    Shapes(#[from] crate::shapes::ShapeError),
    #[error(transparent)]
    Constraint(#[from] crate::template::ConstraintError),
    #[error(transparent)]
    Compile(#[from] crate::compile::CompileError),
    #[error(transparent)]
    Gpu(#[from] crate::gpu::GpuError),
    #[error(transparent)]
    Bench(#[from] crate::bench::run::BenchError),
    #[error(transparent)]
    Search(#[from] crate::search::SearchError),
    #[error(transparent)]
    Tune(#[from] crate::tune::run::TuneError),
    #[error(transparent)]
    Log(#[from] crate::tune::log::LogError),
    #[error(transparent)]
    Merge(#[from] crate::tune::merge::MergeError),
    #[error(transparent)]
    Emit(#[from] crate::tune::emit::EmitError),
    #[error(transparent)]
    Table(#[from] crate::table::TableError),
    #[error(transparent)]
    Runtime(#[from] crate::runtime::RuntimeError),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    #[test]
    fn module_errors_convert_and_keep_their_message() {
        let e: super::Error =
            crate::shapes::ShapeFile::load(std::path::Path::new("/nonexistent.ron"))
                .unwrap_err()
                .into();
        assert!(e.to_string().contains("/nonexistent.ron"), "{e}");
    }
}
