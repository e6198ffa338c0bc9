// Package cuda is kvfabric's binding to the CUDA driver API, loaded with
// dlopen at run time: no CUDA headers or toolkit are needed to build, and a
// machine without a driver or a GPU gets an error from Open (wrapping
// ErrNotSupported or ErrUnavailable) and runs on host memory. Built without
// cgo, Open always returns ErrNotSupported.
//
// The library is Config.Path, else $KVFABRIC_CUDA_LIB, else libcuda.so.1.
// The binding declares the few driver types it uses itself and calls the
// versioned symbols a real driver exports (cuMemAlloc_v2,
// cuMemcpyHtoDAsync_v2, cuMemcpy2DAsync_v2, cuMemHostRegister_v2,
// cuIpcOpenMemHandle_v2, ...). Tests load softcuda, a software GPU with the
// same exports, instead.
//
// Contexts: each device's primary context is retained on first use and made
// current inside every C call that needs it, so goroutines that move
// between threads never run against another device's context.
//
// What it offers:
//
//	device memory    AllocDevice -> *DeviceMemory, a pool.Storage of kind Device (Bytes nil)
//	pinned memory    AllocPinned (cuMemHostAlloc), PinHost (cuMemHostRegister_v2 of host storage)
//	                 and PinHostRanges (the same, range by range: Pin, Unpin)
//	engines          DeviceMemory.IPCHandle, Driver.OpenIPCHandle -> *IPCMemory, Close
//	the NIC          Driver.DmabufFD (cuMemGetHandleForAddressRange, flags 0); ErrNotSupported
//	                 means fall back to the peer-memory path, as NCCL does
//	copies           Stream.CopyAsync (HtoD, DtoH, DtoD), Stream.Copy2DAsync (pitched),
//	                 Stream.CopyPeerAsync (between GPUs), Event
//	plans            Stream.ExecutePlan: a layout.Plan as one 2-D copy per segment (strides
//	                 wider than MaxPitch piece by piece), checked before anything is queued;
//	                 segments between regions on different GPUs (Region.Device) as peer
//	                 copies (cuMemcpyPeerAsync, cuMemcpy3DPeerAsync)
//	staging          Stager: double-buffered pinned staging between host bytes and the device,
//	                 Upload and Download of Parts (each a plan, so strided and past
//	                 MaxPitch), overlapping the host side with the copies across parts;
//	                 StagingBuffers keeps the pinned buffers for reuse, freeing those a
//	                 failed synchronisation may still touch; a transfer or Close whose
//	                 stream could not be synchronised returns an error matching
//	                 ErrUnsynced, and the device memory it was bound for stays out of use
package cuda
