package rdma

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
)

func TestCoalesce(t *testing.T) {
	const G = MaxReadBytes
	seq := func(n int, remoteGap, localGap uint64) []Piece {
		var ps []Piece
		for i := range n {
			ps = append(ps, Piece{RemoteAddr: 1000 + uint64(i)*(100+remoteGap), RKey: 9, LocalAddr: 50000 + uint64(i)*(100+localGap), LKey: 3, Length: 100})
		}
		return ps
	}
	for _, tc := range []struct {
		desc     string
		pieces   []Piece
		maxSGE   int
		wantOps  int
		wantSGEs []int
	}{
		{"contiguous on both sides: one entry", seq(10, 0, 0), 4, 1, []int{1}},
		{"contiguous remotely only: one entry each", seq(4, 0, 28), 4, 1, []int{4}},
		{"scatter list at the limit", seq(4, 0, 28), 4, 1, []int{4}},
		{"scatter list past the limit", seq(5, 0, 28), 4, 2, []int{4, 1}},
		{"gap on the remote side", seq(3, 1, 0), 4, 3, []int{1, 1, 1}},
		{"different rkeys", []Piece{{RemoteAddr: 0, RKey: 1, LocalAddr: 0, LKey: 3, Length: 8}, {RemoteAddr: 8, RKey: 2, LocalAddr: 8, LKey: 3, Length: 8}}, 4, 2, []int{1, 1}},
		{"message at the limit", []Piece{{RemoteAddr: 0, RKey: 1, LocalAddr: 0, LKey: 3, Length: G - 1}, {RemoteAddr: G - 1, RKey: 1, LocalAddr: 1 << 40, LKey: 3, Length: 1}}, 4, 1, []int{2}},
		{"message past the limit", []Piece{{RemoteAddr: 0, RKey: 1, LocalAddr: 0, LKey: 3, Length: G}, {RemoteAddr: G, RKey: 1, LocalAddr: 1 << 40, LKey: 3, Length: 1}}, 4, 2, []int{1, 1}},
		{"one piece longer than a message is split", []Piece{{RemoteAddr: 0, RKey: 1, LocalAddr: 0, LKey: 3, Length: 2*G + 5}}, 4, 3, []int{1, 1, 1}},
	} {
		ops, err := Coalesce(tc.pieces, tc.maxSGE)
		if err != nil {
			t.Fatalf("%s: %v", tc.desc, err)
		}
		if len(ops) != tc.wantOps {
			t.Fatalf("%s: %d ops, want %d: %+v", tc.desc, len(ops), tc.wantOps, ops)
		}
		for i, op := range ops {
			if len(op.Local) != tc.wantSGEs[i] {
				t.Errorf("%s: op %d has %d entries, want %d", tc.desc, i, len(op.Local), tc.wantSGEs[i])
			}
		}
		if err := validateOps(ops, tc.maxSGE); err != nil {
			t.Errorf("%s: coalesced ops do not pass Read's checks: %v", tc.desc, err)
		}
		checkSameBytes(t, tc.desc, tc.pieces, ops)
	}
	for _, bad := range []struct {
		desc   string
		pieces []Piece
		maxSGE int
	}{
		{"zero-length piece", []Piece{{Length: 0}}, 4},
		{"wrapping piece", []Piece{{RemoteAddr: ^uint64(0) - 1, Length: 4}}, 4},
		{"no scatter entries allowed", []Piece{{Length: 1}}, 0},
	} {
		if _, err := Coalesce(bad.pieces, bad.maxSGE); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("%s: %v, want ErrInvalidArgument", bad.desc, err)
		}
	}
}

// checkSameBytes walks pieces and ops byte range by byte range and checks
// that every local range is fed from the same remote range.
func checkSameBytes(t *testing.T, desc string, pieces []Piece, ops []ReadOp) {
	t.Helper()
	type run struct{ remote, local, n uint64 }
	var want, got []run
	add := func(rs *[]run, r run) {
		if k := len(*rs) - 1; k >= 0 && (*rs)[k].remote+(*rs)[k].n == r.remote && (*rs)[k].local+(*rs)[k].n == r.local {
			(*rs)[k].n += r.n
			return
		}
		*rs = append(*rs, r)
	}
	for _, p := range pieces {
		add(&want, run{p.RemoteAddr, p.LocalAddr, p.Length})
	}
	for _, op := range ops {
		r := op.RemoteAddr
		for _, s := range op.Local {
			add(&got, run{r, s.Addr, uint64(s.Length)})
			r += uint64(s.Length)
		}
	}
	if len(want) != len(got) {
		t.Fatalf("%s: %d runs from the ops, want %d", desc, len(got), len(want))
	}
	for i := range want {
		if want[i] != got[i] {
			t.Fatalf("%s: run %d is %+v, want %+v", desc, i, got[i], want[i])
		}
	}
}

func TestCoalesceRandom(t *testing.T) {
	for seed := range uint64(200) {
		rng := rand.New(rand.NewPCG(seed, 7))
		var pieces []Piece
		remote, local := uint64(rng.IntN(1<<20)), uint64(rng.IntN(1<<20))
		for range 1 + rng.IntN(40) {
			n := uint64(1 + rng.IntN(4096))
			pieces = append(pieces, Piece{RemoteAddr: remote, RKey: uint32(1 + rng.IntN(2)), LocalAddr: local, LKey: 3, Length: n})
			remote += n + uint64(rng.IntN(2)*rng.IntN(64))
			local += n + uint64(rng.IntN(2)*rng.IntN(64))
		}
		maxSGE := 1 + rng.IntN(5)
		ops, err := Coalesce(pieces, maxSGE)
		if err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		if err := validateOps(ops, maxSGE); err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		checkSameBytes(t, fmt.Sprintf("seed %d", seed), pieces, ops)
	}
}
