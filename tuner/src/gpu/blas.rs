//! Peer GEMMs through cuBLAS (BF16) and cuBLASLt (FP8 E4M3, per-tensor scales), same layout as ours:
//! Y[M, N] (bf16, row-major) = A[M, K] * W[N, K]^T.

use super::device::{DeviceBuf, Gpu, GpuError};
use cudarc::cublas::{result as blas, sys as bsys, CudaBlas};
use cudarc::cublaslt::{result as lt, sys as ltsys};
use std::ffi::c_void;

fn blas_err(call: &'static str) -> impl Fn(cudarc::cublas::result::CublasError) -> GpuError {
    move |e| GpuError::Blas { call, message: format!("{e:?}") }
}
fn missing(what: &str) -> GpuError {
    GpuError::Blas {
        call: "dlopen",
        message: format!(
            "{what} not found by the system loader: install the CUDA toolkit's cuBLAS or add its \
             lib folder to LD_LIBRARY_PATH"
        ),
    }
}
fn lt_err(call: &'static str) -> impl Fn(cudarc::cublaslt::result::CublasError) -> GpuError {
    move |e| GpuError::Blas { call, message: format!("{e:?}") }
}

/// cuBLAS BF16 GEMM on the Gpu's stream (or, through [`CublasBf16::set_stream`], a raw one).
#[derive(Debug)]
pub struct CublasBf16 {
    blas: CudaBlas,
}

impl CublasBf16 {
    pub fn new(gpu: &Gpu) -> Result<Self, GpuError> {
        // cudarc loads cuBLAS on first use and panics when it is missing: check first.
        // SAFETY: probing only dlopens candidate names; no symbol of the library is called.
        if !unsafe { bsys::is_culib_present() } {
            return Err(missing("cuBLAS (libcublas.so)"));
        }
        Ok(Self { blas: CudaBlas::new(gpu.stream().clone()).map_err(blas_err("cublasCreate"))? })
    }

    /// Issue the following GEMMs on the raw stream `stream`.
    ///
    /// # Safety
    /// `stream` must be 0 or a live stream of the device's primary context, alive while GEMMs
    /// are issued on it.
    pub unsafe fn set_stream(&self, stream: super::raw::RawStream) -> Result<(), GpuError> {
        // SAFETY: the handle is live; the stream per the contract above.
        unsafe { blas::set_stream(*self.blas.handle(), stream as bsys::cudaStream_t) }
            .map_err(blas_err("cublasSetStream"))
    }

    /// Use `bytes` of device memory at `ptr` as cuBLAS's workspace for the following GEMMs on
    /// the current stream (until the next [`CublasBf16::set_stream`], which restores cuBLAS's
    /// default workspace).
    ///
    /// # Safety
    /// `ptr` must be a 256-byte aligned device buffer of the primary context of `bytes` bytes,
    /// alive and used by nothing else until the GEMMs issued with it have completed.
    pub unsafe fn set_workspace(&self, ptr: u64, bytes: usize) -> Result<(), GpuError> {
        // SAFETY: the handle is live; the buffer per the contract above.
        unsafe { bsys::cublasSetWorkspace_v2(*self.blas.handle(), ptr as *mut c_void, bytes) }
            .result()
            .map_err(blas_err("cublasSetWorkspace"))
    }

    /// Y = alpha * A * W^T with A bf16 [m, k], W bf16 [n, k], Y bf16 [m, n], all row-major.
    ///
    /// # Safety
    /// The buffers must hold at least m*k, n*k and m*n elements.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn gemm(
        &self,
        m: i32,
        n: i32,
        k: i32,
        alpha: f32,
        a: u64,
        w: u64,
        y: u64,
    ) -> Result<(), GpuError> {
        let beta = 0.0f32;
        // Column-major view: Y^T (n x m) = W (k x n)^T * A^T (k x m).
        // SAFETY: handle is live; pointers are device buffers sized per the contract above.
        unsafe {
            blas::gemm_ex(
                *self.blas.handle(),
                bsys::cublasOperation_t::CUBLAS_OP_T,
                bsys::cublasOperation_t::CUBLAS_OP_N,
                n,
                m,
                k,
                &alpha as *const f32 as *const c_void,
                w as *const c_void,
                bsys::cudaDataType_t::CUDA_R_16BF,
                k,
                a as *const c_void,
                bsys::cudaDataType_t::CUDA_R_16BF,
                k,
                &beta as *const f32 as *const c_void,
                y as *mut c_void,
                bsys::cudaDataType_t::CUDA_R_16BF,
                n,
                bsys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                bsys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(blas_err("cublasGemmEx"))
    }
}

/// A planned cuBLASLt FP8 (E4M3 x E4M3 -> BF16) GEMM for one (m, n, k), per-tensor scales.
#[derive(Debug)]
pub struct CublasLtFp8 {
    handle: ltsys::cublasLtHandle_t,
    desc: ltsys::cublasLtMatmulDesc_t,
    layouts: [ltsys::cublasLtMatrixLayout_t; 3],
    algo: ltsys::cublasLtMatmulAlgo_t,
    workspace: DeviceBuf<u8>,
    stream: ltsys::cudaStream_t,
}

// SAFETY: the handles are used from one thread at a time (the owner's), never concurrently.
unsafe impl Send for CublasLtFp8 {}

impl CublasLtFp8 {
    /// Plan Y[m, n] = (sa * A[m, k]) * (sw * W[n, k])^T; `scale_a`/`scale_w` are device f32 scalars
    /// whose addresses are bound now and read at every launch.
    pub fn new(
        gpu: &Gpu,
        m: u64,
        n: u64,
        k: u64,
        scale_a: &DeviceBuf<f32>,
        scale_w: &DeviceBuf<f32>,
    ) -> Result<Self, GpuError> {
        use ltsys::cublasLtMatmulDescAttributes_t as D;
        use ltsys::cudaDataType_t as T;
        // SAFETY: as in CublasBf16::new (a dlopen probe).
        if !unsafe { ltsys::is_culib_present() } {
            return Err(missing("cuBLASLt (libcublasLt.so)"));
        }
        let handle = lt::create_handle().map_err(lt_err("cublasLtCreate"))?;
        let desc =
            lt::create_matmul_desc(ltsys::cublasComputeType_t::CUBLAS_COMPUTE_32F, T::CUDA_R_32F)
                .map_err(lt_err("cublasLtMatmulDescCreate"))?;
        let set = |attr: D, ptr: *const c_void, size: usize| {
            // SAFETY: desc is live; ptr points to `size` readable bytes.
            unsafe { lt::set_matmul_desc_attribute(desc, attr, ptr, size) }
                .map_err(lt_err("cublasLtMatmulDescSetAttribute"))
        };
        let op_t = bsys::cublasOperation_t::CUBLAS_OP_T;
        let op_n = bsys::cublasOperation_t::CUBLAS_OP_N;
        set(D::CUBLASLT_MATMUL_DESC_TRANSA, &op_t as *const _ as _, std::mem::size_of_val(&op_t))?;
        set(D::CUBLASLT_MATMUL_DESC_TRANSB, &op_n as *const _ as _, std::mem::size_of_val(&op_n))?;
        let (pa, pw) = (scale_w.ptr(), scale_a.ptr());
        // cuBLASLt's "A" is our W (weights), its "B" is our A (activations).
        set(D::CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &pa as *const u64 as _, 8)?;
        set(D::CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &pw as *const u64 as _, 8)?;
        let lay = |t: T, rows: u64, cols: u64, ld: i64| {
            lt::create_matrix_layout(t, rows, cols, ld)
                .map_err(lt_err("cublasLtMatrixLayoutCreate"))
        };
        let la = lay(T::CUDA_R_8F_E4M3, k, n, k as i64)?;
        let lb = lay(T::CUDA_R_8F_E4M3, k, m, k as i64)?;
        let lc = lay(T::CUDA_R_16BF, n, m, n as i64)?;
        let workspace = gpu.alloc_zeros::<u8>(32 << 20)?;
        let pref = lt::create_matmul_pref().map_err(lt_err("cublasLtMatmulPreferenceCreate"))?;
        let ws = workspace.bytes();
        // SAFETY: pref is live; the value is a usize as the attribute requires.
        unsafe {
            lt::set_matmul_pref_attribute(
                pref,
                ltsys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                &ws as *const usize as _,
                std::mem::size_of::<usize>(),
            )
        }
        .map_err(lt_err("cublasLtMatmulPreferenceSetAttribute"))?;
        // SAFETY: all descriptors were created above and are live.
        let heur = unsafe { lt::get_matmul_algo_heuristic(handle, desc, la, lb, lc, lc, pref) };
        // SAFETY: pref is destroyed once, after its last use.
        let _ = unsafe { lt::destroy_matmul_pref(pref) };
        let heur = heur.map_err(lt_err("cublasLtMatmulAlgoGetHeuristic"))?;
        Ok(Self {
            handle,
            desc,
            layouts: [la, lb, lc],
            algo: heur.algo,
            workspace,
            stream: gpu.stream().cu_stream() as ltsys::cudaStream_t,
        })
    }

    /// Launch with A e4m3 [m, k], W e4m3 [n, k], Y bf16 [m, n] (row-major device buffers).
    ///
    /// # Safety
    /// The buffers must have the sizes this plan was made for.
    pub unsafe fn gemm(&self, a: u64, w: u64, y: u64) -> Result<(), GpuError> {
        let (alpha, beta) = (1.0f32, 0.0f32);
        let [la, lb, lc] = self.layouts;
        // SAFETY: plan objects are live; buffers per the contract above.
        unsafe {
            lt::matmul(
                self.handle,
                self.desc,
                &alpha as *const f32 as _,
                &beta as *const f32 as _,
                w as *const c_void,
                la,
                a as *const c_void,
                lb,
                y as *const c_void,
                lc,
                y as *mut c_void,
                lc,
                &self.algo,
                self.workspace.ptr() as *mut c_void,
                self.workspace.bytes(),
                self.stream,
            )
        }
        .map_err(lt_err("cublasLtMatmul"))
    }
}

impl Drop for CublasLtFp8 {
    fn drop(&mut self) {
        // SAFETY: each object was created by this plan and is destroyed exactly once; failures
        // only leak host memory, and drops never panic.
        unsafe {
            for l in self.layouts {
                let _ = lt::destroy_matrix_layout(l);
            }
            let _ = lt::destroy_matmul_desc(self.desc);
            let _ = lt::destroy_handle(self.handle);
        }
    }
}
