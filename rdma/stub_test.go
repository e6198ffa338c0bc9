//go:build !cgo || !linux

package rdma

import (
	"context"
	"errors"
	"testing"
)

func TestStubSaysNotSupported(t *testing.T) {
	if _, err := Open(Config{}); !errors.Is(err, ErrNotSupported) {
		t.Fatalf("Open: %v, want ErrNotSupported", err)
	}
	var l Library
	var d Device
	var q QueuePair
	for name, err := range map[string]error{
		"Devices":        func() error { _, err := l.Devices(); return err }(),
		"OpenDevice":     func() error { _, err := l.OpenDevice("x", 1); return err }(),
		"RegisterMemory": func() error { _, err := d.RegisterMemory(make([]byte, 1)); return err }(),
		"RegisterDmabuf": func() error { _, err := d.RegisterDmabuf(3, 0, 1, 0); return err }(),
		"NewQueuePair":   func() error { _, err := d.NewQueuePair(QPOptions{}); return err }(),
		"Connect":        q.Connect(Endpoint{}),
		"Reset":          q.Reset(),
		"Read":           q.Read(context.Background(), nil),
		"State":          func() error { _, err := q.State(); return err }(),
	} {
		if !errors.Is(err, ErrNotSupported) {
			t.Errorf("%s: %v, want ErrNotSupported", name, err)
		}
	}
	if l.Close() != nil || d.Close() != nil || q.Close() != nil {
		t.Error("Close in the stub build failed")
	}
}
