//go:build !cgo || !linux

package discover

import "fmt"

// Discover needs NVML, which go-nvml reaches through cgo.
func Discover(cfg Config) ([]GPU, error) {
	return nil, fmt.Errorf("discover: built without cgo, NVML cannot be loaded: %w", ErrNotSupported)
}
