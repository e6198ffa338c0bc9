package pool

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvfabric/kvfabric/layout"
)

// Many goroutines allocate, register, acquire and release while leases
// come, go and expire under a clock that jumps: no slot is ever owned
// twice, and no block is recycled under a lease that was still valid.
func TestConcurrentOwnershipAndLeases(t *testing.T) {
	workers, lessors, iters := 6, 3, 1500
	if *long {
		iters = 20000
	}
	const nslots, nhashes = 64, 96
	clock := newManualClock()
	var events atomic.Int64
	cfg := testConfig(clock, func(b EventBatch) { events.Add(int64(len(b.Events))) })
	cfg.ExpiryInterval = time.Millisecond
	cfg.LowWatermark, cfg.HighWatermark = 0.1, 0.2
	p, b := newTestPool(t, cfg, testLayout(nslots, 2, layout.FullyContiguous, 64))
	owner := make([]atomic.Int32, nslots)
	fail := make(chan string, 64)
	report := func(format string, args ...any) {
		select {
		case fail <- fmt.Sprintf(format, args...):
		default:
		}
	}
	take := func(g int32, blk Block) {
		if prev := owner[blk.Slot].Swap(g); prev != 0 {
			report("slot %d handed to worker %d while worker %d owns it", blk.Slot, g, prev)
		}
	}
	give := func(g int32, blk Block) {
		if prev := owner[blk.Slot].Swap(0); prev != g {
			report("slot %d given back by worker %d but owned by %d", blk.Slot, g, prev)
		}
	}

	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			g := int32(w + 1)
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			var refs []Block
			for range iters {
				switch rng.IntN(3) {
				case 0, 1:
					blks, err := b.Allocate(1 + rng.IntN(2))
					if errors.Is(err, ErrExhausted) {
						break
					} else if err != nil {
						report("allocate: %v", err)
						return
					}
					for _, blk := range blks {
						take(g, blk)
					}
					for _, blk := range blks {
						if info, _ := b.Slot(blk.Slot); info.State != Partial || info.Generation != blk.Generation {
							report("owned slot %d changed under its owner: %+v", blk.Slot, info)
						}
						if rng.IntN(5) == 0 {
							give(g, blk)
							if err := b.Abort(blk); err != nil {
								report("abort: %v", err)
							}
							continue
						}
						if err := b.Commit(blk); err != nil {
							report("commit: %v", err)
						}
						give(g, blk) // the pool owns it from Register on
						reg, err := b.Register(blk, uint64(rng.IntN(nhashes)), 0)
						if err != nil {
							report("register: %v", err)
							continue
						}
						refs = append(refs, reg)
					}
				case 2:
					if blk, ok := b.Acquire(uint64(rng.IntN(nhashes))); ok {
						refs = append(refs, blk)
					}
				}
				for len(refs) > 4 || (len(refs) > 0 && rng.IntN(2) == 0) {
					blk := refs[0]
					refs = refs[1:]
					if info, _ := b.Slot(blk.Slot); info.State != Registered || info.Generation != blk.Generation || info.Users == 0 {
						report("referenced block %+v recycled: %+v", blk, info)
					}
					if err := b.Release(blk); err != nil {
						report("release: %v", err)
					}
				}
			}
			for _, blk := range refs {
				b.Release(blk)
			}
		}()
	}
	for l := range lessors {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(l), 2))
			st := b.Layout().Strides()
			for range iters {
				hashes := make([]uint64, 1+rng.IntN(8))
				for i := range hashes {
					hashes[i] = uint64(rng.IntN(nhashes))
				}
				id, ans, err := b.Lease(hashes, time.Duration(1+rng.IntN(40))*time.Millisecond)
				if err != nil {
					report("lease: %v", err)
					return
				}
				if id == 0 {
					continue
				}
				// Read for a while, as a transfer would, checking that the
				// leased blocks stay put; the clock may expire the lease
				// meanwhile, and then Release must say so.
				moved := ""
				for range 1 + rng.IntN(4) {
					for _, a := range ans {
						if !a.Found {
							continue
						}
						info, _ := b.Slot(a.Slot)
						if info.Generation != a.Generation || info.State != Registered {
							moved = fmt.Sprintf("slot %d: leased at generation %d, now %+v", a.Slot, a.Generation, info)
						}
						err := p.CheckRead(id, b.ID(), rng.IntN(2), uint64(a.Slot)*st.Block, st.Shard)
						if err != nil && !errors.Is(err, ErrLeaseExpired) && !errors.Is(err, ErrUnknownLease) {
							report("read of leased slot %d refused: %v", a.Slot, err)
						}
					}
					runtime.Gosched()
				}
				if valid, _ := p.ReleaseLease(id); valid && moved != "" {
					report("recycled under a lease still valid at release: %s", moved)
				}
			}
		}()
	}
	stop := make(chan struct{})
	var clockWG sync.WaitGroup
	clockWG.Add(1)
	go func() {
		defer clockWG.Done()
		for {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Microsecond):
				clock.Advance(time.Millisecond)
			}
		}
	}()
	wg.Wait()
	close(stop)
	clockWG.Wait()
	close(fail)
	for msg := range fail {
		t.Error(msg)
	}
	clock.Advance(time.Hour)
	p.ExpireLeases()
	m := b.Metrics()
	if m.Active != 0 || m.Leases != 0 || m.Free+m.Inactive != nslots || m.Registered != m.Inactive {
		t.Errorf("after everyone let go: %+v", m)
	}
	for i := range owner {
		if g := owner[i].Load(); g != 0 {
			t.Errorf("slot %d still owned by worker %d", i, g)
		}
	}
	t.Logf("registered %d, evictions %d, leases expired %d, events %d",
		m.Registered, m.Evictions, m.LeasesExpired, events.Load())
}
