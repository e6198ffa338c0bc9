//go:build cgo && linux

package ofi

import (
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
