//! The measuring harness: timing policy, interleaved graph timing, statistics, physical floors,
//! GEMM candidates, peers and the dequantize-then-cuBLAS path on rotated operands, and the
//! reports they produce.

pub mod composite;
pub mod floors;
pub mod gemm;
pub mod moe;
pub mod moe_report;
pub mod moe_weights;
pub mod peers;
pub mod policy;
pub mod report;
pub mod run;
pub mod stats;
pub mod timer;

pub use policy::TimingPolicy;
pub use stats::Summary;
