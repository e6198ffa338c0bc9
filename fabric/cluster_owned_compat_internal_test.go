package fabric

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/kvfabric/kvfabric/fabric/index"
	"github.com/kvfabric/kvfabric/transfer"
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

// Only an owner's own refusal of a call marks it as older: this side's
// errors that wrap ErrInvalidRequest too (a stream ended before its
// answer, an answer that would not decode) do not.
func TestRefusedKindIsTheOwnersAnswer(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"owner refuses the request", &transfer.RemoteError{Peer: "n1", Method: "index", Code: transfer.CodeInvalidRequest, Message: "unknown kind 3"}, true},
		{"owner's refusal, wrapped", fmt.Errorf("index lookup: %w", &transfer.RemoteError{Code: transfer.CodeInvalidRequest}), true},
		{"owner fails otherwise", &transfer.RemoteError{Code: transfer.CodeInternal}, false},
		{"stream ended before the answer", fmt.Errorf("read answer: %w", transfer.ErrFrame), false},
		{"local invalid request", fmt.Errorf("decode: %w", transfer.ErrInvalidRequest), false},
		{"no error", nil, false},
	} {
		if got := refusedKind(tc.err); got != tc.want {
			t.Errorf("%s: refusedKind(%v) = %v, want %v", tc.name, tc.err, got, tc.want)
		}
	}
}
