//! A side stream for work that runs beside a caller's stream: forked from it (the side stream
//! waits for an event recorded on the caller's stream) and joined back (the caller's stream waits
//! for an event recorded on the side stream). Both work while the caller's stream is being
//! captured into a CUDA graph: the side stream then joins the capture, and the join ends its part.

use super::device::{drv, Gpu, GpuError};
use super::raw::RawStream;
use cudarc::driver::{sys, CudaContext};
use std::sync::Arc;

/// A non-blocking stream of the device's primary context and the two events of its fork and join.
#[derive(Debug)]
pub struct SideStream {
    context: Arc<CudaContext>,
    stream: sys::CUstream,
    fork: sys::CUevent,
    join: sys::CUevent,
}

// SAFETY: CUDA stream and event handles may be used from any thread of the process once their
// context is current (every method binds it first); the handles are only destroyed in Drop.
unsafe impl Send for SideStream {}
// SAFETY: as Send: the methods take &self and only pass the handles to the driver, which
// serializes what it must.
unsafe impl Sync for SideStream {}

impl Gpu {
    /// A new side stream of this device (created outside any capture: a workspace's, at creation).
    pub fn side_stream(&self) -> Result<SideStream, GpuError> {
        self.bind_to_thread()?;
        let mut stream: sys::CUstream = std::ptr::null_mut();
        let flags = sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32;
        // SAFETY: the primary context is current; `stream` is valid for one write.
        unsafe { sys::cuStreamCreate(&mut stream, flags) }
            .result()
            .map_err(drv("cuStreamCreate"))?;
        let mut side = SideStream {
            context: self.context().clone(),
            stream,
            fork: std::ptr::null_mut(),
            join: std::ptr::null_mut(),
        };
        let flags = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
        for event in [&mut side.fork, &mut side.join] {
            // SAFETY: the context is current; `event` is valid for one write. On error, Drop
            // destroys what was created (null handles are skipped).
            unsafe { sys::cuEventCreate(event, flags) }.result().map_err(drv("cuEventCreate"))?;
        }
        Ok(side)
    }
}

impl SideStream {
    /// The side stream's raw handle (launch the forked work on it).
    pub fn raw(&self) -> RawStream {
        self.stream as RawStream
    }

    /// Make the side stream wait for the work enqueued on `caller` so far.
    ///
    /// # Safety
    /// `caller` must be 0 or a live stream of this device's primary context.
    pub unsafe fn fork_from(&self, caller: RawStream) -> Result<(), GpuError> {
        // SAFETY: the caller's contract; the side stream and event are alive (self).
        unsafe { self.order(caller as sys::CUstream, self.fork, self.stream) }
    }

    /// Make `caller` wait for the work enqueued on the side stream so far.
    ///
    /// # Safety
    /// As `fork_from`.
    pub unsafe fn join_into(&self, caller: RawStream) -> Result<(), GpuError> {
        // SAFETY: as fork_from.
        unsafe { self.order(self.stream, self.join, caller as sys::CUstream) }
    }

    /// Record `event` on `from`, then make `to` wait for it.
    ///
    /// # Safety
    /// Both streams live streams (or 0) of the primary context; `event` one of self's.
    unsafe fn order(
        &self,
        from: sys::CUstream,
        event: sys::CUevent,
        to: sys::CUstream,
    ) -> Result<(), GpuError> {
        self.context.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
        // SAFETY: the context is current; streams and event per the contract above.
        unsafe {
            sys::cuEventRecord(event, from).result().map_err(drv("cuEventRecord"))?;
            sys::cuStreamWaitEvent(to, event, 0).result().map_err(drv("cuStreamWaitEvent"))
        }
    }
}

impl Drop for SideStream {
    fn drop(&mut self) {
        // Nothing to report from here: a failure leaves a handle to the context's teardown.
        if self.context.bind_to_thread().is_err() {
            return;
        }
        // SAFETY: the handles were created by `Gpu::side_stream` and are destroyed once; work
        // still queued on the stream completes before the driver releases it.
        unsafe {
            for event in [self.fork, self.join] {
                if !event.is_null() {
                    let _ = sys::cuEventDestroy_v2(event);
                }
            }
            if !self.stream.is_null() {
                let _ = sys::cuStreamDestroy_v2(self.stream);
            }
        }
    }
}
