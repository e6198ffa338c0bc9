package fabric

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/kvfabric/kvfabric/fabric/index"
)

func TestOwnedWireRoundTrip(t *testing.T) {
	c := index.OpsCall{Inc: 7, First: 3, Replace: true, Ops: []index.Op{{Kind: index.OpStore, Hash: 1}, {Kind: index.OpRemove, Hash: 2}, {Kind: index.OpForget, Hash: 1 << 63}}}
	got, err := decodeOpsCall(appendOpsCall(nil, c))
	if err != nil || got.Inc != c.Inc || got.First != c.First || !got.Replace || !slices.Equal(got.Ops, c.Ops) {
		t.Fatalf("ops call: %+v, %v; want %+v", got, err, c)
	}
	hashes := []uint64{1, 2, 3}
	hs, err := decodeLookupCall(appendLookupCall(nil, hashes, true))
	if err != nil || !slices.Equal(hs, hashes) {
		t.Fatalf("lookup call: %v, %v", hs, err)
	}
	if c := appendLookupCall(nil, hashes, true); c[0] != ownedCallLookupTiers {
		t.Fatalf("a lookup asks kind %d, want %d (with tiers)", c[0], ownedCallLookupTiers)
	}
	old := appendLookupCall(nil, hashes, false)
	if old[0] != ownedCallLookup {
		t.Fatalf("a lookup without tiers asks kind %d, want %d", old[0], ownedCallLookup)
	}
	if hs, err := decodeLookupCall(old); err != nil || !slices.Equal(hs, hashes) {
		t.Fatalf("lookup call without tiers: %v, %v", hs, err)
	}
	holders := [][]index.Holder{{{Name: "a"}, {Name: "b", DiskOnly: true}}, {}, {{Name: "b"}}}
	for _, tiers := range []bool{true, false} {
		ans, err := decodeLookupAnswer(appendLookupAnswer(nil, holders, tiers), 3, tiers)
		want := holders
		if !tiers { // the tier does not travel
			want = [][]index.Holder{{{Name: "a"}, {Name: "b"}}, {}, {{Name: "b"}}}
		}
		if err != nil || len(ans) != 3 || !slices.Equal(ans[0], want[0]) || len(ans[1]) != 0 || !slices.Equal(ans[2], want[2]) {
			t.Fatalf("lookup answer (tiers %v): %v, %v", tiers, ans, err)
		}
	}
	c = index.OpsCall{Inc: 1, First: 1, Ops: []index.Op{{Kind: index.OpStoreDisk, Hash: 4}, {Kind: index.OpRemoveDisk, Hash: 4}}}
	if got, err := decodeOpsCall(appendOpsCall(nil, c)); err != nil || !slices.Equal(got.Ops, c.Ops) {
		t.Fatalf("disk ops: %+v, %v", got, err)
	}
}

// Each limit of the index calls: at it decodes, one past it is refused.
func TestOwnedWireLimits(t *testing.T) {
	ops := make([]index.Op, maxOwnedOps+1)
	for i := range ops {
		ops[i] = index.Op{Kind: index.OpStore, Hash: uint64(i)}
	}
	if _, err := decodeOpsCall(appendOpsCall(nil, index.OpsCall{First: 1, Ops: ops[:maxOwnedOps]})); err != nil {
		t.Fatalf("%d ops: %v", maxOwnedOps, err)
	}
	if _, err := decodeOpsCall(appendOpsCall(nil, index.OpsCall{First: 1, Ops: ops})); !errors.Is(err, errOwnedWire) {
		t.Fatalf("%d ops: %v, want refused", maxOwnedOps+1, err)
	}
	hashes := make([]uint64, maxLookupHashes+1)
	if _, err := decodeLookupCall(appendLookupCall(nil, hashes[:maxLookupHashes], true)); err != nil {
		t.Fatalf("%d hashes: %v", maxLookupHashes, err)
	}
	if _, err := decodeLookupCall(appendLookupCall(nil, hashes, true)); !errors.Is(err, errOwnedWire) {
		t.Fatalf("%d hashes: %v, want refused", maxLookupHashes+1, err)
	}
	long := string(bytes.Repeat([]byte{'n'}, maxOwnedNameLen))
	if _, err := decodeLookupAnswer(appendLookupAnswer(nil, [][]index.Holder{{{Name: long}}}, true), 1, true); err != nil {
		t.Fatalf("a name of %d bytes: %v", maxOwnedNameLen, err)
	}
	if _, err := decodeLookupAnswer(appendLookupAnswer(nil, [][]index.Holder{{{Name: long + "n"}}}, true), 1, true); !errors.Is(err, errOwnedWire) {
		t.Fatalf("a name of %d bytes: %v, want refused", maxOwnedNameLen+1, err)
	}
	// An answer names at most index.MaxNodes holders; a name count past
	// that, or past what two bytes a name leave room for, is refused
	// before anything is made for it.
	many := make([]index.Holder, index.MaxNodes+1)
	for i := range many {
		many[i].Name = fmt.Sprintf("%x", i)
	}
	if ans, err := decodeLookupAnswer(appendLookupAnswer(nil, [][]index.Holder{many[:index.MaxNodes]}, false), 1, false); err != nil || len(ans[0]) != index.MaxNodes {
		t.Fatalf("an answer naming %d holders: %d, %v", index.MaxNodes, len(ans), err)
	}
	if _, err := decodeLookupAnswer(appendLookupAnswer(nil, [][]index.Holder{many}, false), 1, false); !errors.Is(err, errOwnedWire) || !strings.Contains(err.Error(), "name count") {
		t.Fatalf("an answer naming %d holders: %v, want refused", index.MaxNodes+1, err)
	}
	lying := binary.AppendUvarint(nil, 4000)
	lying = append(lying, make([]byte, 7998)...) // room for 3,999 names of 2 bytes
	if _, err := decodeLookupAnswer(lying, 1, false); !errors.Is(err, errOwnedWire) || !strings.Contains(err.Error(), "name count 4000") {
		t.Fatalf("4,000 names in 7,998 bytes: %v, want the name count refused", err)
	}
	// A name twice in the table, or a holder twice for one hash.
	for _, bad := range [][]byte{{2, 1, 'a', 1, 'a', 1, 0}, {1, 1, 'a', 2, 0, 0}} {
		if _, err := decodeLookupAnswer(bad, 1, false); !errors.Is(err, errOwnedWire) {
			t.Errorf("answer % x: %v, want refused", bad, err)
		}
	}
	for _, bad := range []struct {
		desc string
		b    []byte
	}{
		{"unknown op kind", appendOpsCall(nil, index.OpsCall{First: 1, Ops: []index.Op{{Kind: index.MaxOpKind + 1, Hash: 1}}})},
		{"ops numbered from zero", appendOpsCall(nil, index.OpsCall{First: 0, Ops: ops[:1]})},
		{"truncated", appendOpsCall(nil, index.OpsCall{First: 1, Ops: ops[:2]})[:30]},
		{"unknown flags", func() []byte { b := appendOpsCall(nil, index.OpsCall{First: 1}); b[17] = 6; return b }()},
	} {
		if _, err := decodeOpsCall(bad.b); !errors.Is(err, errOwnedWire) {
			t.Errorf("%s: %v, want refused", bad.desc, err)
		}
	}
}

func FuzzOwnedWire(f *testing.F) {
	f.Add(appendOpsCall(nil, index.OpsCall{Inc: 1, First: 1, Ops: []index.Op{{Kind: index.OpStore, Hash: 5}}}))
	f.Add(appendLookupCall(nil, []uint64{1, 2}, true))
	f.Add(appendLookupAnswer(nil, [][]index.Holder{{{Name: "a"}}, {{Name: "a"}, {Name: "b", DiskOnly: true}}}, true))
	f.Fuzz(func(t *testing.T, b []byte) {
		// What decodes encodes to what decodes the same (varints may
		// come overlong, so not to the same bytes).
		if c, err := decodeOpsCall(b); err == nil {
			again, err := decodeOpsCall(appendOpsCall(nil, c))
			if err != nil || again.Inc != c.Inc || again.First != c.First || again.Replace != c.Replace || !slices.Equal(again.Ops, c.Ops) {
				t.Fatalf("ops call %x: %+v re-decodes to %+v, %v", b, c, again, err)
			}
		}
		if hs, err := decodeLookupCall(b); err == nil {
			again, err := decodeLookupCall(appendLookupCall(nil, hs, true))
			if err != nil || !slices.Equal(again, hs) {
				t.Fatalf("lookup call %x: %v re-decodes to %v, %v", b, hs, again, err)
			}
		}
		for n := range 3 {
			for _, tiers := range []bool{true, false} {
				ans, err := decodeLookupAnswer(b, n, tiers)
				if err != nil {
					continue
				}
				if len(ans) != n {
					t.Fatalf("answer of %d hashes decoded to %d", n, len(ans))
				}
				again, err := decodeLookupAnswer(appendLookupAnswer(nil, ans, tiers), n, tiers)
				if err != nil || fmt.Sprint(again) != fmt.Sprint(ans) {
					t.Fatalf("answer %x: %v re-decodes to %v, %v", b, ans, again, err)
				}
			}
		}
	})
}

// Owners' answers for one hash merge into each holder once, in memory
// where any owner knows of a copy in memory, in the order first named.
func TestMergeHolders(t *testing.T) {
	a := []index.Holder{{Name: "a", DiskOnly: true}, {Name: "b", DiskOnly: true}}
	got := mergeHolders(nil, a)
	got = mergeHolders(got, []index.Holder{{Name: "c", DiskOnly: true}, {Name: "b"}, {Name: "a", DiskOnly: true}})
	want := []index.Holder{{Name: "a", DiskOnly: true}, {Name: "b"}, {Name: "c", DiskOnly: true}}
	if !slices.Equal(got, want) {
		t.Fatalf("merged %v, want %v", got, want)
	}
	if a[1].DiskOnly != true {
		t.Fatal("the merge changed the first owner's answer")
	}
	// Two owners naming index.MaxNodes holders each, half of them the same.
	one, two := make([]index.Holder, index.MaxNodes), make([]index.Holder, index.MaxNodes)
	for i := range one {
		one[i].Name, two[i].Name = fmt.Sprint(i), fmt.Sprint(i+index.MaxNodes/2)
	}
	if got := mergeHolders(mergeHolders(nil, one), two); len(got) != index.MaxNodes*3/2 {
		t.Fatalf("merged %d holders, want %d", len(got), index.MaxNodes*3/2)
	}
}
