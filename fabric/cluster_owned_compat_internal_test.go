package fabric

import (
	"slices"
	"testing"
	"time"

	"github.com/kvfabric/kvfabric/fabric/index"
)

// An owner that refused the newer calls is sent the older ones until
// legacyRecheck has passed, then the newer again.
func TestLegacyOwnersRecheck(t *testing.T) {
	var l legacyOwners
	t0 := time.Unix(1000, 0)
	if l.is("a", t0) {
		t.Fatal("an owner never marked is old")
	}
	l.mark("a", t0)
	for _, tc := range []struct {
		desc string
		at   time.Duration
		want bool
	}{
		{"at once", 0, true},
		{"just before the recheck", legacyRecheck - time.Nanosecond, true},
		{"at the recheck", legacyRecheck, false},
		{"after it (forgotten)", 0, false},
	} {
		if got := l.is("a", t0.Add(tc.at)); got != tc.want {
			t.Fatalf("%s: old %v, want %v", tc.desc, got, tc.want)
		}
	}
	if l.is("b", t0) {
		t.Fatal("another owner is old")
	}
}

func TestOpsBeforeTiers(t *testing.T) {
	ops := []index.Op{{Kind: index.OpStore, Hash: 1}, {Kind: index.OpStoreDisk, Hash: 2}, {Kind: index.OpRemoveDisk, Hash: 2}, {Kind: index.OpRemove, Hash: 1}, {Kind: index.OpForget, Hash: 3}}
	orig := slices.Clone(ops)
	want := []index.Op{{Kind: index.OpStore, Hash: 1}, {Kind: index.OpStore, Hash: 2}, {Kind: index.OpRemove, Hash: 2}, {Kind: index.OpRemove, Hash: 1}, {Kind: index.OpForget, Hash: 3}}
	if got := opsBeforeTiers(ops); !slices.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	if !slices.Equal(ops, orig) {
		t.Fatal("the queued ops were changed in place")
	}
	plain := want
	if got := opsBeforeTiers(plain); &got[0] != &plain[0] {
		t.Fatal("ops without disk copies were copied")
	}
}
