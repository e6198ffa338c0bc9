package cuda

import (
	"errors"
	"fmt"
)

// Sentinels. Every error the package returns matches one of them with
// errors.Is.
var (
	// ErrNotSupported: this build or this machine cannot use CUDA at all
	// (built without cgo, library not found, a driver too old to export a
	// call we need), or the driver refuses a feature (dma-buf export). The
	// caller falls back: host pools, or the peer-memory path for the NIC.
	ErrNotSupported = errors.New("cuda: not supported")
	// ErrMissingCall is matched, with ErrNotSupported, when the library
	// loads but lacks a driver-API call the binding needs: a driver too
	// old, a library that is not libcuda, or a declaration of ours that
	// names a call wrongly. Tests on a real GPU fail on it rather than skip.
	ErrMissingCall = errors.New("cuda: driver lacks a call")
	// ErrUnavailable: the driver loaded but there is no usable GPU
	// (CUDA_ERROR_NO_DEVICE, no devices, a device index out of range).
	ErrUnavailable = errors.New("cuda: no device")
	// ErrOutOfMemory matches CUDA_ERROR_OUT_OF_MEMORY.
	ErrOutOfMemory = errors.New("cuda: out of memory")
	// ErrInvalidValue matches CUDA_ERROR_INVALID_VALUE and bad arguments
	// refused before reaching the driver.
	ErrInvalidValue = errors.New("cuda: invalid value")
	// ErrInvalidHandle matches CUDA_ERROR_INVALID_HANDLE: a stream, event or
	// IPC handle the driver does not know (an IPC handle whose exporter has
	// gone, for instance).
	ErrInvalidHandle = errors.New("cuda: invalid handle")
	// ErrClosed is returned after Close.
	ErrClosed = errors.New("cuda: closed")
	// ErrUnsynced is matched, with the driver's error, when a Stager
	// could not synchronise its stream: the copies it queued may still
	// land, in its buffers and in the device memory they were bound for,
	// which must then stay out of use.
	ErrUnsynced = errors.New("cuda: copies not synchronised; they may still land")
)

// Result is a CUresult, the driver's status code.
type Result int

// Driver status codes this package names.
const (
	Success                      Result = 0
	ErrorInvalidValue            Result = 1
	ErrorOutOfMemory             Result = 2
	ErrorNotInitialized          Result = 3
	ErrorNoDevice                Result = 100
	ErrorInvalidDevice           Result = 101
	ErrorInvalidContext          Result = 201
	ErrorMapFailed               Result = 205
	ErrorInvalidHandle           Result = 400
	ErrorNotReady                Result = 600
	ErrorHostMemoryRegistered    Result = 712
	ErrorHostMemoryNotRegistered Result = 713
	ErrorNotSupported            Result = 801
	ErrorUnknown                 Result = 999
)

// Error is a driver call that returned a status other than success.
type Error struct {
	// Call is the driver function, e.g. "cuMemAlloc_v2".
	Call string
	// Code is what it returned.
	Code Result
	// Name is the driver's name for Code (cuGetErrorName), when it has one.
	Name string
}

func (e *Error) Error() string {
	name := e.Name
	if name == "" {
		name = "CUresult"
	}
	return fmt.Sprintf("cuda: %s: %s (%d)", e.Call, name, int(e.Code))
}

// Is matches the sentinel for the code.
func (e *Error) Is(target error) bool {
	switch target {
	case ErrOutOfMemory:
		return e.Code == ErrorOutOfMemory
	case ErrInvalidValue:
		return e.Code == ErrorInvalidValue
	case ErrInvalidHandle:
		return e.Code == ErrorInvalidHandle
	case ErrNotSupported:
		return e.Code == ErrorNotSupported
	case ErrUnavailable:
		return e.Code == ErrorNoDevice || e.Code == ErrorInvalidDevice
	}
	return false
}
