//go:build !cgo || !linux

package discover

import (
	"errors"
	"testing"
)

func TestDiscoverStub(t *testing.T) {
	gpus, err := Discover(Config{})
	if gpus != nil || !errors.Is(err, ErrNotSupported) {
		t.Errorf("Discover without cgo = %v, %v; want ErrNotSupported", gpus, err)
	}
}
