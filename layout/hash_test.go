package layout

import (
	"errors"
	"testing"

	"github.com/zeebo/xxh3"
)

// The known values of the recipe (block size 4, no salt, no LoRA).
func TestHashKnownValues(t *testing.T) {
	h, err := NewHasher(4, HashOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got := h.Sequence([]uint32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14})
	want := []BlockHash{
		{Local: 14643705804678351452, Sequence: 14643705804678351452},
		{Local: 16777012769546811212, Sequence: 4945711292740353085},
		{Local: 483935686894639516, Sequence: 12583592247330656132},
	}
	if len(got) != len(want) {
		t.Fatalf("got %d blocks, want %d (partial block must not be hashed)", len(got), len(want))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("block %d: got %+v, want %+v", i, got[i], want[i])
		}
	}
}

func TestHashIncrementalMatchesSequence(t *testing.T) {
	h, _ := NewHasher(16, HashOptions{Salt: "llama-3-70b", LoRA: "sql-adapter"})
	tokens := make([]uint32, 16*9+3)
	for i := range tokens {
		tokens[i] = uint32(i*7919) ^ 0xdeadbeef
	}
	all := h.Sequence(tokens)
	var parent *BlockHash
	for i := range all {
		b, err := h.Next(parent, tokens[i*16:(i+1)*16])
		if err != nil {
			t.Fatal(err)
		}
		if b != all[i] {
			t.Fatalf("block %d: incremental %+v, whole %+v", i, b, all[i])
		}
		parent = &b
	}
}

// Salt and LoRA move the seed as the recipe says: wrapping adds of
// xxh3(lora, 0) and xxh3(salt, 1).
func TestHashSaltAndLoRA(t *testing.T) {
	tokens := []uint32{1, 2, 3, 4, 5, 6, 7, 8}
	plain, _ := NewHasher(4, HashOptions{})
	cases := []struct {
		name string
		opts HashOptions
		seed uint64
	}{
		{"salt", HashOptions{Salt: "model-fp"}, 1337 + xxh3.HashStringSeed("model-fp", 1)},
		{"lora", HashOptions{LoRA: "adapter"}, 1337 + xxh3.HashStringSeed("adapter", 0)},
		{"both", HashOptions{Salt: "model-fp", LoRA: "adapter"},
			1337 + xxh3.HashStringSeed("adapter", 0) + xxh3.HashStringSeed("model-fp", 1)},
		{"empty strings are absent", HashOptions{Salt: "", LoRA: ""}, 1337},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h, err := NewHasher(4, tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			got := h.Sequence(tokens)
			buf := []byte{1, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0, 4, 0, 0, 0}
			if want := xxh3.HashSeed(buf, tc.seed); got[0].Local != want {
				t.Errorf("local[0] = %d, want %d", got[0].Local, want)
			}
			if got[1].Sequence != ChainHash(got[0].Sequence, got[1].Local) {
				t.Errorf("sequence hash not chained with seed 1337")
			}
			ref := plain.Sequence(tokens)
			if (tc.seed == 1337) != (got[0] == ref[0]) {
				t.Errorf("namespace %+v: hashes equal to the plain ones: %v", tc.opts, got[0] == ref[0])
			}
		})
	}
}

func TestHashBadInput(t *testing.T) {
	for _, n := range []int{0, -1, MaxBlockSize + 1} {
		if _, err := NewHasher(n, HashOptions{}); !errors.Is(err, ErrBlockSize) {
			t.Errorf("NewHasher(%d): err = %v, want ErrBlockSize", n, err)
		}
	}
	h, _ := NewHasher(4, HashOptions{})
	if _, err := h.Next(nil, []uint32{1, 2, 3}); err == nil {
		t.Error("Next with a short block: no error")
	}
	if got := h.Sequence([]uint32{1, 2, 3}); len(got) != 0 {
		t.Errorf("Sequence of a partial block = %v, want none", got)
	}
}

// The in-place path for little-endian machines and the portable one agree.
func TestHashPortablePath(t *testing.T) {
	h, _ := NewHasher(16, HashOptions{Salt: "s"})
	for n := range 40 {
		tokens := make([]uint32, n)
		for i := range tokens {
			tokens[i] = uint32(i*2654435761) ^ uint32(n)
		}
		if a, b := h.localHash(tokens), h.localHashPortable(tokens); a != b {
			t.Fatalf("%d tokens: %d in place, %d portable", n, a, b)
		}
	}
}
