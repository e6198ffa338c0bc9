//go:build !linux

package fabric

import "math"

// hostMemory is not known here: no host pool is refused for its size.
func hostMemory() (uint64, error) { return math.MaxUint64, nil }

// fsSize is not known here: no memory directory is refused for its size.
func fsSize(string) (uint64, error) { return math.MaxUint64, nil }
