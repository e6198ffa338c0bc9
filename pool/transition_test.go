package pool

import (
	"errors"
	"testing"

	"github.com/kvfabric/kvfabric/layout"
)

// toState drives a fresh slot to the wanted state and returns its handle.
func toState(t *testing.T, b *BlockSet, want State, hash uint64) Block {
	t.Helper()
	blks, err := b.Allocate(1)
	if err != nil {
		t.Fatal(err)
	}
	blk := blks[0]
	if want == Partial {
		return blk
	}
	if err := b.Commit(blk); err != nil {
		t.Fatal(err)
	}
	if want == Complete {
		return blk
	}
	reg, err := b.Register(blk, hash, 0)
	if err != nil {
		t.Fatal(err)
	}
	return reg
}

func TestInvalidTransitions(t *testing.T) {
	ops := map[string]func(b *BlockSet, blk Block) error{
		"commit":   func(b *BlockSet, blk Block) error { return b.Commit(blk) },
		"abort":    func(b *BlockSet, blk Block) error { return b.Abort(blk) },
		"register": func(b *BlockSet, blk Block) error { _, err := b.Register(blk, 99, 0); return err },
		"release":  func(b *BlockSet, blk Block) error { return b.Release(blk) },
	}
	cases := []struct {
		desc  string
		state State
		op    string
		ok    bool
	}{
		{"commit a partial block", Partial, "commit", true},
		{"abort a partial block (aborted sequence)", Partial, "abort", true},
		{"register before commit", Partial, "register", false},
		{"release a partial block", Partial, "release", false},
		{"commit twice", Complete, "commit", false},
		{"abort a complete block (invalidated)", Complete, "abort", true},
		{"register a complete block", Complete, "register", true},
		{"release a complete block", Complete, "release", false},
		{"commit a registered block", Registered, "commit", false},
		{"abort a registered block", Registered, "abort", false},
		{"register twice", Registered, "register", false},
		{"release a registered block", Registered, "release", true},
	}
	for _, tc := range cases {
		t.Run(tc.desc, func(t *testing.T) {
			_, b := newTestPool(t, testConfig(nil, nil), testLayout(4, 1, layout.FullyContiguous, 64))
			blk := toState(t, b, tc.state, 7)
			err := ops[tc.op](b, blk)
			if tc.ok {
				if err != nil {
					t.Fatalf("%s from %s: %v", tc.op, tc.state, err)
				}
				return
			}
			var te *TransitionError
			if !errors.As(err, &te) || !errors.Is(err, ErrInvalidTransition) {
				t.Fatalf("%s from %s: err = %v, want a TransitionError", tc.op, tc.state, err)
			}
			if te.Op != tc.op || te.State != tc.state || te.Slot != blk.Slot {
				t.Errorf("error %+v does not name op %s, state %s, slot %d", te, tc.op, tc.state, blk.Slot)
			}
			info, _ := b.Slot(blk.Slot)
			if info.State != tc.state || info.Generation != blk.Generation {
				t.Errorf("refused %s changed the slot: %+v", tc.op, info)
			}
		})
	}
}

func TestReleaseWithoutReferences(t *testing.T) {
	_, b := newTestPool(t, testConfig(nil, nil), testLayout(4, 1, layout.FullyContiguous, 64))
	blk := toState(t, b, Registered, 5)
	if err := b.Release(blk); err != nil {
		t.Fatal(err)
	}
	err := b.Release(blk)
	var te *TransitionError
	if !errors.As(err, &te) || te.Reason == "" {
		t.Fatalf("second release: err = %v, want a TransitionError with a reason", err)
	}
}

func TestStaleAndBadHandles(t *testing.T) {
	_, b := newTestPool(t, testConfig(nil, nil), testLayout(4, 1, layout.FullyContiguous, 64))
	blk := toState(t, b, Partial, 0)
	if err := b.Abort(blk); err != nil {
		t.Fatal(err)
	}
	if info, _ := b.Slot(blk.Slot); info.Generation != blk.Generation+1 || info.State != Reset {
		t.Fatalf("after abort: %+v, want Reset with generation %d", info, blk.Generation+1)
	}
	for name, err := range map[string]error{
		"commit":  b.Commit(blk),
		"abort":   b.Abort(blk),
		"release": b.Release(blk),
	} {
		if !errors.Is(err, ErrStaleBlock) {
			t.Errorf("%s with a stale handle: err = %v, want ErrStaleBlock", name, err)
		}
	}
	if _, err := b.Register(blk, 1, 0); !errors.Is(err, ErrStaleBlock) {
		t.Errorf("register with a stale handle: err = %v", err)
	}
	for _, s := range []int{-1, 4, 1 << 40} {
		if err := b.Commit(Block{Slot: s}); !errors.Is(err, ErrBadSlot) {
			t.Errorf("commit slot %d: err = %v, want ErrBadSlot", s, err)
		}
		if _, err := b.Slot(s); !errors.Is(err, ErrBadSlot) {
			t.Errorf("Slot(%d): err = %v, want ErrBadSlot", s, err)
		}
	}
	for _, n := range []int{0, -3} {
		if _, err := b.Allocate(n); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("Allocate(%d): err = %v, want ErrInvalidArgument", n, err)
		}
	}
}
