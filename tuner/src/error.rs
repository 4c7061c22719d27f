//! The crate's top-level error type; each module keeps its own typed error and converts into this one.

/// Every fallible public API of the library returns this (or a module error that converts into it).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
