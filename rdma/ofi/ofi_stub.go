//go:build !cgo || !linux

package ofi

import (
	"context"
	"fmt"
	"time"
)

// errBuild says why this build has no libfabric.
var errBuild = fmt.Errorf("ofi: libfabric is off: this kvfabric was built without cgo or not for Linux: %w", ErrNotSupported)

// Library is an opened libfabric; this build cannot open one.
type Library struct{}

// Load returns an error wrapping ErrNotSupported in this build.
func Load(cfg Config) (*Library, error) { return nil, errBuild }

// Version is empty in this build.
func (l *Library) Version() string { return "" }

// Close does nothing in this build.
func (l *Library) Close() error { return nil }

// Providers returns an error wrapping ErrNotSupported in this build.
func (l *Library) Providers() ([]ProviderInfo, error) { return nil, errBuild }

// Open returns an error wrapping ErrNotSupported in this build.
func (l *Library) Open() (*Endpoint, error) { return nil, errBuild }

// Endpoint is an RDM endpoint; this build has none.
type Endpoint struct{}

// Info is empty in this build.
func (e *Endpoint) Info() ProviderInfo { return ProviderInfo{} }

// Name is empty in this build.
func (e *Endpoint) Name() []byte { return nil }

// Broken returns nil: nothing opens in this build.
func (e *Endpoint) Broken() error { return nil }

// Reopen returns an error wrapping ErrNotSupported.
func (e *Endpoint) Reopen() (*Endpoint, error) { return nil, errBuild }

// Stats are an endpoint's counters.
type Stats struct {
	Reads, Bytes, Failures uint64
	Staged                 uint64
	Inline                 uint64
}

// Stats is zero in this build.
func (e *Endpoint) Stats() Stats { return Stats{} }

// Peer is a peer endpoint in the address vector.
type Peer struct{}

// AddPeer returns an error wrapping ErrNotSupported in this build.
func (e *Endpoint) AddPeer(name []byte) (Peer, error) { return Peer{}, errBuild }

// RemovePeer returns an error wrapping ErrNotSupported in this build.
func (e *Endpoint) RemovePeer(p Peer) error { return errBuild }

// Region is registered memory; this build has none.
type Region struct{}

// Register returns an error wrapping ErrNotSupported in this build.
func (e *Endpoint) Register(addr uintptr, length uint64) (*Region, error) { return nil, errBuild }

// RegisterCUDA returns an error wrapping ErrNotSupported in this build.
func (e *Endpoint) RegisterCUDA(ptr uintptr, length uint64, dev int) (*Region, error) {
	return nil, errBuild
}

// Len is zero in this build.
func (r *Region) Len() uint64 { return 0 }

// Remote is zero in this build.
func (r *Region) Remote() Remote { return Remote{} }

// Close does nothing in this build.
func (r *Region) Close() error { return nil }

// Read returns an error wrapping ErrNotSupported in this build.
func (e *Endpoint) Read(ctx context.Context, peer Peer, dst *Region, segs []Segment) error {
	return errBuild
}

// ReadDetailed returns an error wrapping ErrNotSupported in this build.
func (e *Endpoint) ReadDetailed(ctx context.Context, peer Peer, dst *Region, segs []Segment) (ReadResult, error) {
	return ReadResult{}, errBuild
}

// Close does nothing in this build.
func (e *Endpoint) Close() error { return nil }

// Serve does nothing in this build.
func (e *Endpoint) Serve(until time.Time) (done func()) { return func() {} }

// ServeInline does nothing in this build.
func (e *Endpoint) ServeInline(until time.Time) (done func()) { return func() {} }

// MaxNap is zero in this build.
func (e *Endpoint) MaxNap() time.Duration { return 0 }

// Serving is false in this build.
func (e *Endpoint) Serving() bool { return false }

// ShmPrefix begins the names of shm endpoints (see the cgo build).
const ShmPrefix = "kvf-"
