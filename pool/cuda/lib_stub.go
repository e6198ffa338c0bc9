//go:build !cgo || !linux

package cuda

import (
	"fmt"
	"unsafe"
)

const maxDevices = 64

type (
	streamHandle = unsafe.Pointer
	eventHandle  = unsafe.Pointer
)

// lib is never made in this build: openLib always fails, so no method
// below is reached.
type lib struct{}

var errNoCgo = fmt.Errorf("cuda: built without cgo or off Linux, the driver cannot be loaded: %w", ErrNotSupported)

func openLib(path string) (*lib, error) { return nil, errNoCgo }

func (lb *lib) close()                                 {}
func (lb *lib) deviceCount() (int, error)              { return 0, errNoCgo }
func (lb *lib) deviceInfo(dev int) (DeviceInfo, error) { return DeviceInfo{}, errNoCgo }
func (lb *lib) retain(dev int) error                   { return errNoCgo }
func (lb *lib) release(dev int) error                  { return errNoCgo }
func (lb *lib) memInfo(dev int) (uint64, uint64, error) {
	return 0, 0, errNoCgo
}
func (lb *lib) memAlloc(dev int, n uint64) (uint64, error) { return 0, errNoCgo }
func (lb *lib) memFree(dev int, p uint64) error            { return errNoCgo }
func (lb *lib) addressRange(dev int, p uint64) (uint64, uint64, error) {
	return 0, 0, errNoCgo
}
func (lb *lib) hostAlloc(dev int, n uint64) (unsafe.Pointer, error)    { return nil, errNoCgo }
func (lb *lib) hostFree(dev int, p unsafe.Pointer) error               { return errNoCgo }
func (lb *lib) hostRegister(dev int, p unsafe.Pointer, n uint64) error { return errNoCgo }
func (lb *lib) hostUnregister(dev int, p unsafe.Pointer) error         { return errNoCgo }
func (lb *lib) copyAsync(dev int, dir Direction, dst, src, n uint64, s streamHandle) error {
	return errNoCgo
}
func (lb *lib) copy2DAsync(dev int, c Copy2D, s streamHandle) error { return errNoCgo }
func (lb *lib) copySync(dev int, dir Direction, host []byte, devptr uint64, s streamHandle) error {
	return errNoCgo
}
func (lb *lib) copyPeerAsync(dev int, dst uint64, dstDev int, src uint64, srcDev int, n uint64, s streamHandle) error {
	return errNoCgo
}
func (lb *lib) copy2DPeerAsync(dev int, c Copy2D, dstDev, srcDev int, s streamHandle) error {
	return errNoCgo
}
func (lb *lib) pointerDevice(dev int, p uint64) (int, error)             { return -1, errNoCgo }
func (lb *lib) streamCreate(dev int) (streamHandle, error)               { return nil, errNoCgo }
func (lb *lib) streamDestroy(dev int, s streamHandle) error              { return errNoCgo }
func (lb *lib) streamSync(dev int, s streamHandle) error                 { return errNoCgo }
func (lb *lib) streamWait(dev int, s streamHandle, e eventHandle) error  { return errNoCgo }
func (lb *lib) eventCreate(dev int) (eventHandle, error)                 { return nil, errNoCgo }
func (lb *lib) eventDestroy(dev int, e eventHandle) error                { return errNoCgo }
func (lb *lib) eventRecord(dev int, e eventHandle, s streamHandle) error { return errNoCgo }
func (lb *lib) eventSync(dev int, e eventHandle) error                   { return errNoCgo }
func (lb *lib) eventQuery(dev int, e eventHandle) (bool, error)          { return false, errNoCgo }
func (lb *lib) ipcGet(dev int, p uint64) (IPCHandle, error)              { return IPCHandle{}, errNoCgo }
func (lb *lib) ipcOpen(dev int, h IPCHandle) (uint64, error)             { return 0, errNoCgo }
func (lb *lib) ipcClose(dev int, p uint64) error                         { return errNoCgo }
func (lb *lib) dmabuf(dev int, p, n uint64) (int, error)                 { return -1, errNoCgo }
