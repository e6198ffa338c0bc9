package fabric_test

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvfabric/kvfabric/fabric"
	"github.com/kvfabric/kvfabric/internal/wait"
)

// Each announcement of the tiers is made under their ordering, the
// records already saying what it announces: copies down to the host tier,
// moves down from it to a disk tier, and evictions from it (alone, the
// bottom tier), in either index mode.
func TestTierAnnouncementsUnderTheirOrdering(t *testing.T) {
	for _, tc := range []struct {
		desc, mode string
		disk       bool // a disk tier below the host tier
	}{
		{"owned index, host over disk", fabric.IndexOwned, true},
		{"whole index, host over disk", fabric.IndexWhole, true},
		{"owned index, host alone", fabric.IndexOwned, false},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			const n = 600 // more than the set's slots and the host tier's blocks together
			cfg := testConfig(t, "ordered")
			cfg.IndexMode = tc.mode
			cfg.Tiers = []string{fmt.Sprintf("host=%d", fabric.MinHostTierBytes)}
			if tc.disk {
				cfg.Tiers = append(cfg.Tiers, fmt.Sprintf("disk=%s:64MiB", tierDir(t)))
			}
			type kind struct {
				store bool
				set   uint32
			}
			var (
				agent atomic.Pointer[fabric.Agent]
				mu    sync.Mutex
				wrong []error
				seen  = map[kind]int{}
			)
			fabric.OnTierAnnounced(&cfg, func(store bool, set uint32, hashes []uint64) {
				a := agent.Load()
				if a == nil {
					return // before the test holds the agent: announceAll's
				}
				err := fabric.TierAnnouncementChecked(a, store, set, hashes)
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					wrong = append(wrong, err)
				}
				seen[kind{store, set}] += len(hashes)
			})
			a := startAgent(t, cfg)
			agent.Store(a)
			wait.For(t, 10*time.Second, "the tiers announce each change", func() error {
				if !fabric.TierAnnouncing(a) {
					return fmt.Errorf("not yet")
				}
				return nil
			})
			c := newClient(t, a)
			set := register(t, c, tierEngine)
			storeThrough(t, c, set, n, a)
			mu.Lock()
			defer mu.Unlock()
			for i, err := range wrong {
				if i == 5 {
					t.Fatalf("... %d in all", len(wrong))
				}
				t.Error(err)
			}
			host := fabric.TierAnnounceSet(a, 0)
			type announced struct {
				what string
				kind kind
			}
			want := []announced{{"copies down to the host tier", kind{true, host}}}
			if tc.disk {
				want = append(want, announced{"moves down: stored on disk", kind{true, fabric.TierAnnounceSet(a, 1)}},
					announced{"moves down: gone from host memory", kind{false, host}})
			} else {
				want = append(want, announced{"evictions from host memory", kind{false, host}})
			}
			for _, w := range want {
				if seen[w.kind] == 0 {
					t.Errorf("no announcement of %s (store %v, set %d) among %v", w.what, w.kind.store, w.kind.set, seen)
				}
				if testing.Verbose() {
					t.Logf("%s: %d hashes announced", w.what, seen[w.kind])
				}
			}
		})
	}
}
