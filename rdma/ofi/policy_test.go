package ofi

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
)

// Every provider-specific branch of registration, faked by the mr_mode
// providers report (values from libfabric 1.17's providers).
func TestMRModePlan(t *testing.T) {
	for _, c := range []struct {
		name string
		mode MRMode
		want RegPlan
		err  error
	}{
		{"tcp;ofi_rxm: nothing required", 0, RegPlan{}, nil},
		{"shm", MRVirtAddr | MRHMEM, RegPlan{VirtAddr: true, HMEM: true}, nil},
		{"efa", MRLocal | MRVirtAddr | MRAllocated | MRProvKey | MRHMEM,
			RegPlan{LocalDesc: true, VirtAddr: true, ProvKey: true, HMEM: true}, nil},
		{"cxi", MREndpoint | MRAllocated | MRProvKey | MRHMEM,
			RegPlan{BindEndpoint: true, ProvKey: true, HMEM: true}, nil},
		{"verbs;ofi_rxm", MRLocal | MRVirtAddr | MRAllocated | MRProvKey,
			RegPlan{LocalDesc: true, VirtAddr: true, ProvKey: true}, nil},
		{"basic is the old local|virt_addr|allocated|prov_key", mrBasic,
			RegPlan{LocalDesc: true, VirtAddr: true, ProvKey: true}, nil},
		{"raw keys", MRRaw | MRProvKey, RegPlan{}, ErrNotSupported},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := c.mode.Plan()
			if !errors.Is(err, c.err) {
				t.Fatalf("Plan(%v): %v, want %v", c.mode, err, c.err)
			}
			if err == nil && got != c.want {
				t.Fatalf("Plan(%v) = %+v, want %+v", c.mode, got, c.want)
			}
		})
	}
	// A read passes its destination's descriptor under FI_MR_LOCAL, and
	// for device memory under FI_MR_HMEM too (shm, which does not ask for
	// local descriptors, takes a buffer without one for host memory).
	for _, c := range []struct {
		name       string
		mode       MRMode
		host, pass bool
	}{
		{"tcp, host", 0, true, false},
		{"tcp, device", 0, false, false},
		{"shm, host", MRVirtAddr | MRHMEM, true, false},
		{"shm, device", MRVirtAddr | MRHMEM, false, true},
		{"verbs, host", MRLocal | MRVirtAddr | MRAllocated | MRProvKey, true, true},
		{"efa, device", MRLocal | MRVirtAddr | MRAllocated | MRProvKey | MRHMEM, false, true},
	} {
		p, err := c.mode.Plan()
		if err != nil || p.PassDesc(c.host) != c.pass {
			t.Errorf("%s: PassDesc(%v) under %v = %v (%v), want %v", c.name, c.host, c.mode, p.PassDesc(c.host), err, c.pass)
		}
	}
	if s := (MRLocal | MREndpoint | 1<<20).String(); s != "local|endpoint|0x100000" {
		t.Fatalf("String: %q", s)
	}
}

func TestChoose(t *testing.T) {
	tcp := ProviderInfo{Provider: "tcp;ofi_rxm", Domain: "lo", MRKeySize: 8, ThreadSafe: true}
	shm := ProviderInfo{Provider: "shm", Domain: "shm", MRKeySize: 8, MRMode: MRVirtAddr, ThreadSafe: true}
	efa := ProviderInfo{Provider: "efa", Domain: "rdmap0s31-rdm", MRKeySize: 4, MRMode: MRLocal | MRProvKey, ThreadSafe: true}
	cxi := ProviderInfo{Provider: "cxi", Domain: "cxi0", MRKeySize: 8, MRMode: MREndpoint | MRProvKey, ThreadSafe: true}
	verbs := ProviderInfo{Provider: "verbs;ofi_rxm", Domain: "mlx5_0", MRKeySize: 4, MRMode: MRLocal, ThreadSafe: true}
	rawCXI := ProviderInfo{Provider: "cxi", Domain: "cxi1", MRKeySize: 8, MRMode: MRRaw, ThreadSafe: true}
	wideEFA := ProviderInfo{Provider: "efa", Domain: "e1", MRKeySize: 16, ThreadSafe: true}
	// efa as a provider of FI_THREAD_DOMAIN would offer it.
	domainEFA := ProviderInfo{Provider: "efa", Domain: "e2", MRKeySize: 4, MRMode: MRLocal | MRProvKey}
	for _, c := range []struct {
		name    string
		offered []ProviderInfo
		want    string
		got     string // provider and domain chosen, or "" for ErrUnavailable
		errHas  string
	}{
		{"cxi first", []ProviderInfo{tcp, verbs, efa, cxi}, "", "cxi/cxi0", ""},
		{"efa before verbs", []ProviderInfo{verbs, tcp, efa}, "", "efa/rdmap0s31-rdm", ""},
		{"verbs last of the fabrics", []ProviderInfo{tcp, shm, verbs}, "", "verbs;ofi_rxm/mlx5_0", ""},
		{"tcp and shm only when named", []ProviderInfo{tcp, shm}, "", "", "offered: tcp;ofi_rxm, shm"},
		{"tcp by its base name", []ProviderInfo{shm, tcp}, "tcp", "tcp;ofi_rxm/lo", ""},
		{"tcp by its full name", []ProviderInfo{shm, tcp}, "tcp;ofi_rxm", "tcp;ofi_rxm/lo", ""},
		{"named and absent", []ProviderInfo{tcp}, "efa", "", "no usable provider efa"},
		{"raw keys skipped for the next domain", []ProviderInfo{rawCXI, cxi}, "", "cxi/cxi0", ""},
		{"raw keys alone", []ProviderInfo{rawCXI, tcp}, "", "", "cxi (mr_mode raw)"},
		{"keys wider than 8 bytes", []ProviderInfo{wideEFA}, "efa", "", "efa (keys of 16 bytes)"},
		{"not thread safe skipped for the next domain", []ProviderInfo{domainEFA, efa}, "", "efa/rdmap0s31-rdm", ""},
		{"not thread safe alone", []ProviderInfo{domainEFA, tcp}, "efa", "", "efa (not FI_THREAD_SAFE)"},
		{"nothing offered", nil, "", "", "offered: )"},
	} {
		t.Run(c.name, func(t *testing.T) {
			p, err := Choose(c.offered, c.want)
			if c.got == "" {
				if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), c.errHas) {
					t.Fatalf("Choose: %v, want ErrUnavailable naming %q", err, c.errHas)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := p.Provider + "/" + p.Domain; got != c.got {
				t.Fatalf("chose %s, want %s", got, c.got)
			}
		})
	}
}

// TestGather: the requests cover exactly the segments' bytes, each within
// the message size and iov limit, and continuing runs are gathered.
func TestGather(t *testing.T) {
	rem := Remote{Addr: 1 << 40, Len: 1 << 30, Key: 7}
	other := Remote{Addr: 1 << 41, Len: 1 << 30, Key: 8}
	t.Run("cases", func(t *testing.T) {
		for _, c := range []struct {
			name     string
			segs     []Segment
			maxMsg   uint64
			iov      int
			requests int
		}{
			{"one segment", []Segment{{Len: 100, Remote: rem}}, 1 << 20, 4, 1},
			{"split at the message size", []Segment{{Len: 10, Remote: rem}}, 4, 4, 3},
			{"contiguous both sides merge", []Segment{{Len: 8, Remote: rem}, {LocalOff: 8, RemoteOff: 8, Len: 8, Remote: rem}}, 1 << 20, 1, 1},
			{"remote contiguous, local scattered: up to the iov limit", []Segment{
				{LocalOff: 0, RemoteOff: 0, Len: 8, Remote: rem}, {LocalOff: 100, RemoteOff: 8, Len: 8, Remote: rem},
				{LocalOff: 200, RemoteOff: 16, Len: 8, Remote: rem}}, 1 << 20, 2, 2},
			{"iov limit 1 keeps them apart", []Segment{
				{LocalOff: 0, RemoteOff: 0, Len: 8, Remote: rem}, {LocalOff: 100, RemoteOff: 8, Len: 8, Remote: rem}}, 1 << 20, 1, 2},
			{"another key never merges", []Segment{{Len: 8, Remote: rem}, {LocalOff: 8, RemoteOff: 0, Len: 8, Remote: Remote{Addr: rem.Addr + 8, Len: 8, Key: 9}}}, 1 << 20, 4, 2},
			{"remote gap never merges", []Segment{{Len: 8, Remote: rem}, {LocalOff: 8, RemoteOff: 9, Len: 8, Remote: rem}}, 1 << 20, 4, 2},
		} {
			t.Run(c.name, func(t *testing.T) {
				reqs := gather(c.segs, c.maxMsg, c.iov)
				if len(reqs) != c.requests {
					t.Fatalf("%d requests, want %d: %+v", len(reqs), c.requests, reqs)
				}
				checkCovers(t, c.segs, reqs, c.maxMsg, c.iov, 0)
			})
		}
	})
	t.Run("random", func(t *testing.T) {
		seed := rand.Uint64()
		rng := rand.New(rand.NewPCG(seed, 2))
		for range 500 {
			var segs []Segment
			lo, ro := uint64(0), uint64(0)
			for range 1 + rng.IntN(30) {
				n := uint64(1 + rng.IntN(5000))
				r := rem
				if rng.IntN(5) == 0 {
					r = other
				}
				if rng.IntN(3) == 0 {
					lo += uint64(rng.IntN(100))
				}
				if rng.IntN(3) == 0 {
					ro += uint64(rng.IntN(100))
				}
				segs = append(segs, Segment{LocalOff: lo, RemoteOff: ro, Len: n, Remote: r})
				lo, ro = lo+n, ro+n
			}
			maxMsg, iov := uint64(1+rng.IntN(8000)), 1+rng.IntN(8)
			t.Run(fmt.Sprintf("seed %d", seed), func(t *testing.T) { checkCovers(t, segs, gather(segs, maxMsg, iov), maxMsg, iov, 0) })
		}
	})
}

func TestGatherStaged(t *testing.T) {
	rem := Remote{Addr: 1 << 40, Len: 1 << 30, Key: 7}
	other := Remote{Addr: 1 << 41, Len: 1 << 30, Key: 8}
	// scattered is n pieces of size bytes, contiguous in rem, each
	// followed locally by a gap of the same size.
	scattered := func(n int, size uint64) []Segment {
		var segs []Segment
		for i := range uint64(n) {
			segs = append(segs, Segment{LocalOff: 2 * i * size, RemoteOff: i * size, Len: size, Remote: rem})
		}
		return segs
	}
	t.Run("cases", func(t *testing.T) {
		for _, c := range []struct {
			name               string
			segs               []Segment
			maxMsg             uint64
			iov                int
			slot               uint64
			requests, isStaged int
		}{
			{"small pieces past the iov limit: a slot each", scattered(64, 4096), 1 << 30, 4, 64 << 10, 4, 4},
			{"within the iov limit: in place, past the slot", scattered(4, 1<<20), 1 << 30, 4, 64 << 10, 1, 0},
			{"large pieces past the iov limit: in place", scattered(5, 1<<20), 1 << 30, 4, 512 << 10, 2, 0},
			{"pieces split at the slot; a last chunk of one piece in place", scattered(3, 6), 1 << 30, 1, 8, 3, 2},
			{"the message size bounds the slot", scattered(16, 8), 32, 2, 64, 4, 4},
			{"another key is another run", append(scattered(8, 8), Segment{LocalOff: 1000, Len: 8, Remote: other}), 1 << 30, 4, 1 << 20, 2, 1},
			{"contiguous both sides: one piece, in place", []Segment{{Len: 1 << 20, Remote: rem}, {LocalOff: 1 << 20, RemoteOff: 1 << 20, Len: 1 << 20, Remote: rem}}, 1 << 30, 1, 4096, 1, 0},
		} {
			t.Run(c.name, func(t *testing.T) {
				reqs := gatherStaged(c.segs, c.maxMsg, c.iov, c.slot)
				staged := 0
				for _, r := range reqs {
					if r.staged {
						staged++
					}
				}
				if len(reqs) != c.requests || staged != c.isStaged {
					t.Fatalf("%d requests, %d staged; want %d, %d: %+v", len(reqs), staged, c.requests, c.isStaged, reqs)
				}
				checkCovers(t, c.segs, reqs, c.maxMsg, c.iov, c.slot)
			})
		}
	})
	t.Run("random", func(t *testing.T) {
		seed := rand.Uint64()
		rng := rand.New(rand.NewPCG(seed, 3))
		for range 200 {
			var segs []Segment
			lo, ro := uint64(0), uint64(0)
			for range 1 + rng.IntN(60) {
				n := uint64(1 + rng.IntN(2000))
				r := rem
				if rng.IntN(8) == 0 {
					r = other
				}
				if rng.IntN(2) == 0 {
					lo += uint64(1 + rng.IntN(100))
				}
				if rng.IntN(6) == 0 {
					ro += uint64(rng.IntN(100))
				}
				segs = append(segs, Segment{LocalOff: lo, RemoteOff: ro, Len: n, Remote: r})
				lo, ro = lo+n, ro+n
			}
			maxMsg, iov, slot := uint64(1+rng.IntN(40000)), 1+rng.IntN(8), uint64(1+rng.IntN(10000))
			t.Run(fmt.Sprintf("seed %d", seed), func(t *testing.T) {
				checkCovers(t, segs, gatherStaged(segs, maxMsg, iov, slot), maxMsg, iov, slot)
			})
		}
	})
}

// checkCovers maps every byte each way: the requests, walked in order, read
// exactly the remote bytes of the segments into exactly their local bytes.
// A staged request (slot above 0) reads at most slot bytes, of more pieces
// than iov; any other, at most iov pieces.
func checkCovers(t *testing.T, segs []Segment, reqs []request, maxMsg uint64, iov int, slot uint64) {
	t.Helper()
	type pair struct{ key, remote uint64 }
	want := map[uint64]pair{}
	for _, s := range segs {
		for i := range s.Len {
			want[s.LocalOff+i] = pair{s.Remote.Key, s.Remote.Addr + s.RemoteOff + i}
		}
	}
	got := map[uint64]pair{}
	for _, r := range reqs {
		if r.bytes() > maxMsg {
			t.Fatalf("a request of %d bytes past the message size %d", r.bytes(), maxMsg)
		}
		switch {
		case r.staged && slot == 0:
			t.Fatalf("a staged request from gather")
		case r.staged && (r.bytes() > slot || len(r.local) <= iov):
			t.Fatalf("a staged request of %d bytes in %d pieces: want at most the slot's %d bytes, in more pieces than the iov limit %d",
				r.bytes(), len(r.local), slot, iov)
		case !r.staged && len(r.local) > iov:
			t.Fatalf("a request of %d pieces past the iov limit %d", len(r.local), iov)
		}
		addr := r.remoteAddr
		for _, p := range r.local {
			for i := range p.len {
				got[p.off+i] = pair{r.key, addr}
				addr++
			}
		}
	}
	if len(got) != len(want) {
		t.Fatalf("requests cover %d local bytes, segments %d", len(got), len(want))
	}
	for k, v := range want {
		if got[k] != v {
			t.Fatalf("local byte %d: requests read %+v, segments %+v", k, got[k], v)
		}
	}
}

func TestCheckSegmentsLimits(t *testing.T) {
	rem := Remote{Len: 100}
	if err := checkSegments(make([]Segment, MaxSegments+1), 1); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("%d segments: %v", MaxSegments+1, err)
	}
	segs := make([]Segment, MaxSegments)
	for i := range segs {
		segs[i] = Segment{Len: 1, Remote: rem}
	}
	if err := checkSegments(segs, 1); err != nil {
		t.Fatalf("%d segments: %v", MaxSegments, err)
	}
	wrap := Segment{RemoteOff: 8, Len: 8, Remote: Remote{Addr: ^uint64(0) - 4, Len: 100}}
	if err := checkSegments([]Segment{wrap}, 100); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("a wrapping address: %v", err)
	}
}

// Device memory goes to a provider by device pointer exactly when it
// reports FI_HMEM, whatever its mr_mode asks; else it is staged.
func TestDevicePlan(t *testing.T) {
	for _, tc := range []struct {
		name string
		p    ProviderInfo
		want DeviceReg
	}{
		{"efa with FI_HMEM and FI_MR_HMEM", ProviderInfo{Provider: "efa", HMEM: true, MRMode: MRLocal | MRVirtAddr | MRAllocated | MRProvKey | MRHMEM}, DeviceHMEM},
		{"cxi with FI_HMEM, endpoint-bound keys", ProviderInfo{Provider: "cxi", HMEM: true, MRMode: MREndpoint | MRAllocated | MRProvKey}, DeviceHMEM},
		{"shm with FI_MR_HMEM but no FI_HMEM (no CUDA)", ProviderInfo{Provider: "shm", MRMode: MRVirtAddr | MRHMEM}, DeviceStaged},
		{"tcp without FI_HMEM", ProviderInfo{Provider: "tcp;ofi_rxm"}, DeviceStaged},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, why := tc.p.DevicePlan()
			if got != tc.want || !strings.Contains(why, tc.p.Provider) || !strings.Contains(why, "FI_HMEM") {
				t.Errorf("DevicePlan() = %v, %q; want %v, naming the provider and FI_HMEM", got, why, tc.want)
			}
		})
	}
}
