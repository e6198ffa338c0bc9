//go:build cgo && linux

package ofi

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// An open endpoint with no read of its own and no peer reading it keeps
// its progress loop asleep: over two seconds the process uses less than
// idleCPUBound of a core for each provider's endpoint.
// Bounds on an endpoint's CPU, as a share of one core: generous, for loaded CI
// machines.
const (
	idleCPUBound    = 0.05
	servingCPUBound = 0.5
)

func TestIdleEndpointCPU(t *testing.T) {
	const window = 2 * time.Second
	for _, prov := range providers {
		t.Run(prov, func(t *testing.T) {
			l := loadLibrary(t, prov)
			e := openIdle(t, l)
			register(t, e, mapped(t, 1<<20))
			time.Sleep(100 * time.Millisecond) // let the loop settle: what is measured is idle
			cpu0, start := cpuTime(), time.Now()
			time.Sleep(window)
			cpu, wall := cpuTime()-cpu0, time.Since(start)
			share := float64(cpu) / float64(wall)
			t.Logf("%s: idle endpoint used %v of CPU in %v (%.2f%% of a core)", prov, cpu, wall.Round(time.Millisecond), 100*share)
			if share > idleCPUBound {
				t.Errorf("idle endpoint used %.1f%% of a core, want under %.0f%%", 100*share, 100*idleCPUBound)
			}
		})
	}
}

// An endpoint serving (Serve) with no peer reading it naps at most
// servingMaxNap between polls: its loop wakes often, in C, and uses under
// servingCPUBound of a core; once the Serve ends, it naps long again.
func TestServingEndpointCPU(t *testing.T) {
	const window = time.Second
	for _, prov := range providers {
		t.Run(prov, func(t *testing.T) {
			l := loadLibrary(t, prov)
			e := openIdle(t, l)
			done := e.Serve(time.Now().Add(time.Hour))
			if !e.Serving() {
				t.Fatal("not serving after Serve")
			}
			time.Sleep(50 * time.Millisecond)
			naps0, cpu0, start := e.naps.Load(), cpuTime(), time.Now()
			time.Sleep(window)
			naps, cpu, wall := e.naps.Load()-naps0, cpuTime()-cpu0, time.Since(start)
			share := float64(cpu) / float64(wall)
			t.Logf("%s: serving, %d naps, %v of CPU in %v (%.2f%% of a core)", prov, naps, cpu, wall.Round(time.Millisecond), 100*share)
			if min := uint64(wall / (4 * servingMaxNap)); naps < min {
				t.Errorf("%d naps serving for %v, want at least %d (naps of at most %v)", naps, wall, min, servingMaxNap)
			}
			if share > servingCPUBound {
				t.Errorf("serving endpoint used %.1f%% of a core, want under %.0f%%", 100*share, 100*servingCPUBound)
			}
			done()
			if e.Serving() {
				t.Fatal("serving after its Serve ended")
			}
			time.Sleep(100 * time.Millisecond)
			naps0 = e.naps.Load()
			time.Sleep(window)
			if naps := e.naps.Load() - naps0; naps > uint64(2*window/idleMaxNap) {
				t.Errorf("%d naps in %v once the Serve ended, want at most %d", naps, window, 2*window/idleMaxNap)
			}
		})
	}
}

// HostOnly opens a provider without FI_HMEM: nothing listed registers
// device memory, RegisterCUDA refuses, and reads move every byte (shm's
// by cross-memory attach, this process reading itself).
func TestHostOnly(t *testing.T) {
	for _, prov := range providers {
		t.Run(prov, func(t *testing.T) {
			l, err := Load(Config{Provider: prov, Node: nodeFor(prov), HostOnly: true})
			if err != nil {
				t.Fatalf("libfabric is needed for these tests (make test-deps): %v", err)
			}
			t.Cleanup(func() { l.Close() })
			offered, err := l.Providers()
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range offered {
				if p.HMEM {
					t.Errorf("%s on %s listed with FI_HMEM", p.Provider, p.Domain)
				}
			}
			holder, reader := openEndpoint(t, l), openEndpoint(t, l)
			if _, err := reader.RegisterCUDA(0x1000, 4096, 0); !errors.Is(err, ErrNotSupported) {
				t.Errorf("RegisterCUDA on a host-only endpoint: %v, want ErrNotSupported", err)
			}
			src, dst := mapped(t, 1<<20), mapped(t, 1<<20)
			fill(src, 0x3c)
			srcReg, dstReg := register(t, holder, src), register(t, reader, dst)
			peer, err := reader.AddPeer(holder.Name())
			if err != nil {
				t.Fatal(err)
			}
			// 128-byte rows, every other one, as an NHD import reads them.
			var segs []Segment
			for off := uint64(0); off < 1<<19; off += 256 {
				segs = append(segs, Segment{LocalOff: off, RemoteOff: off + 128, Len: 128, Remote: srcReg.Remote()})
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			start := time.Now()
			if err := reader.Read(ctx, peer, dstReg, segs); err != nil {
				t.Fatal(err)
			}
			for _, s := range segs {
				if !bytes.Equal(dst[s.LocalOff:s.LocalOff+s.Len], src[s.RemoteOff:s.RemoteOff+s.Len]) {
					t.Fatalf("row at %d differs", s.LocalOff)
				}
			}
			t.Logf("%s: %d rows of 128 bytes in %v", prov, len(segs), time.Since(start).Round(time.Microsecond))
		})
	}
}

// shm endpoints are named ShmPrefix, the process ID and random hex, so
// that a region a killed process left in /dev/shm under its ID (here: one
// made under every name shm would give this process by default) does not
// keep the endpoint from opening; the name is in the region's file.
func TestShmNameUnique(t *testing.T) {
	l := loadLibrary(t, "shm")
	// shm numbers a process's endpoints from 0: more than the tests open.
	for idx := range 512 {
		stale := fmt.Sprintf("/dev/shm/%d:%d:%d", os.Getpid(), os.Getuid(), idx)
		if _, err := os.Stat(stale); err == nil {
			t.Fatalf("%s exists before the test", stale)
		}
		if err := os.WriteFile(stale, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.Remove(stale) })
	}
	a, b := openIdle(t, l), openIdle(t, l)
	if bytes.Equal(a.Name(), b.Name()) {
		t.Fatalf("two endpoints named %q", a.Name())
	}
	prefix := fmt.Sprintf("%s%d-", ShmPrefix, os.Getpid())
	for _, e := range []*Endpoint{a, b} {
		if !bytes.Contains(e.Name(), []byte(prefix)) {
			t.Errorf("endpoint name %q does not contain %q", e.Name(), prefix)
		}
	}
	files, err := filepath.Glob("/dev/shm/" + prefix + "*")
	if err != nil || len(files) < 2 {
		t.Errorf("regions in /dev/shm named %s*: %v (%v), want the two endpoints'", prefix, files, err)
	}
}
