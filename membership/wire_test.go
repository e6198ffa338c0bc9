package membership

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestBatchRoundTrip(t *testing.T) {
	events := []Event{
		{Origin: "a", Incarnation: 9, Seq: 5, Kind: EventStore, Hash: 1<<63 + 7, BlockSet: 3},
		{Origin: "a", Incarnation: 9, Seq: 6, Kind: EventRemove, Hash: 0, BlockSet: 1 << 31},
	}
	b, err := AppendBatch(nil, events)
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeBatch(b)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, events) {
		t.Fatalf("round trip: got %+v, want %+v", got, events)
	}
}

func TestAppendBatchRefuses(t *testing.T) {
	ok := Event{Origin: "a", Incarnation: 1, Seq: 1, Kind: EventStore}
	for _, tc := range []struct {
		desc   string
		events []Event
		want   string
	}{
		{"empty", nil, "empty"},
		{"no origin", []Event{{Seq: 1, Kind: EventStore}}, "origin"},
		{"gap", []Event{ok, {Origin: "a", Incarnation: 1, Seq: 3, Kind: EventStore}}, "does not follow"},
		{"two origins", []Event{ok, {Origin: "b", Incarnation: 1, Seq: 2, Kind: EventStore}}, "does not follow"},
		{"bad kind", []Event{{Origin: "a", Seq: 1, Kind: 9}}, "kind"},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			if _, err := AppendBatch(nil, tc.events); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("AppendBatch = %v, want error about %q", err, tc.want)
			}
		})
	}
}

func TestDecodeBatchRefuses(t *testing.T) {
	good, _ := AppendBatch(nil, []Event{{Origin: "a", Incarnation: 1, Seq: 1, Kind: EventStore, Hash: 5}})
	for _, tc := range []struct {
		desc string
		b    []byte
		want string
	}{
		{"empty", nil, "truncated"},
		{"wrong version", append([]byte{2}, good[1:]...), "version"},
		{"wrong type", append([]byte{1, msgState}, good[2:]...), "type"},
		{"truncated", good[:len(good)-3], "cannot fit"},
		{"truncated header", good[:4], "truncated"},
		{"trailing", append(append([]byte(nil), good...), 0), "trailing"},
		{"bad kind", append(append([]byte(nil), good[:len(good)-10]...), append([]byte{7}, good[len(good)-9:]...)...), "kind"},
		{"huge count", []byte{1, 1, 1, 'a', 1, 1, 0xff, 0xff, 0xff, 0x7f}, "events"},
		{"seq zero", []byte{1, 1, 1, 'a', 1, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0}, "seq is 0"},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			_, err := DecodeBatch(tc.b)
			if !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("DecodeBatch = %v, want ErrMalformed about %q", err, tc.want)
			}
		})
	}
}

func FuzzDecodeBatch(f *testing.F) {
	for _, evs := range [][]Event{
		{{Origin: "a", Incarnation: 1, Seq: 1, Kind: EventStore, Hash: 5}},
		{{Origin: "node-1", Incarnation: 1 << 60, Seq: 99, Kind: EventRemove, Hash: 1 << 63, BlockSet: 7},
			{Origin: "node-1", Incarnation: 1 << 60, Seq: 100, Kind: EventStore, Hash: 3, BlockSet: 1 << 30}},
	} {
		b, _ := AppendBatch(nil, evs)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		events, err := DecodeBatch(b)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %v does not match ErrMalformed", err)
			}
			return
		}
		enc, err := AppendBatch(nil, events)
		if err != nil {
			t.Fatalf("re-encoding decoded events: %v", err)
		}
		again, err := DecodeBatch(enc)
		if err != nil {
			t.Fatalf("decoding re-encoded batch: %v", err)
		}
		if !reflect.DeepEqual(events, again) {
			t.Fatalf("decode→encode→decode changed events: %+v vs %+v", events, again)
		}
	})
}

func FuzzDecodeState(f *testing.F) {
	f.Add(appendState(nil, []originMark{{"a", 1, 2}, {"node-7", 1 << 62, 0}}))
	f.Add(appendState(nil, nil))
	f.Fuzz(func(t *testing.T, b []byte) {
		marks, err := decodeState(b)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %v does not match ErrMalformed", err)
			}
			return
		}
		again, err := decodeState(appendState(nil, marks))
		if err != nil || !reflect.DeepEqual(marks, again) {
			t.Fatalf("decode→encode→decode: %v, %+v vs %+v", err, marks, again)
		}
	})
}

func FuzzMeta(f *testing.F) {
	for _, m := range []Meta{
		{},
		{PeerAddr: "10.0.0.1:7000", APIAddr: "[::1]:9000", Transports: TransportQUIC | TransportRDMA, LayoutDigest: 77,
			Load: Load{KVUsage: 0.5, Waiting: 3, Imports: 1 << 20}, Incarnation: 1 << 62},
		{PeerAddr: "10.0.0.1:7000", Transports: TransportQUIC | TransportRDMA, GPUs: GPUs{Count: 8, PoolBytes: 8 << 36, NICs: 8, Model: "NVIDIA H100 80GB HBM3"}},
	} {
		b, err := m.MarshalBinary()
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var m Meta
		if err := m.UnmarshalBinary(b); err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %v does not match ErrMalformed", err)
			}
			return
		}
		enc, err := m.MarshalBinary()
		if err != nil {
			t.Fatalf("re-encoding decoded meta %+v: %v", m, err)
		}
		var again Meta
		if err := again.UnmarshalBinary(enc); err != nil || again != m {
			t.Fatalf("decode→encode→decode: %v, %+v vs %+v", err, m, again)
		}
	})
}

func TestMetaValidation(t *testing.T) {
	long := "[fe80::1%" + strings.Repeat("z", 240) + "]:1"
	for _, tc := range []struct {
		desc string
		m    Meta
		want error
	}{
		{"bad peer addr", Meta{PeerAddr: "nowhere"}, ErrInvalidMeta},
		{"unknown transport", Meta{Transports: 1 << 5}, ErrInvalidMeta},
		{"usage above 1", Meta{Load: Load{KVUsage: 1.5}}, ErrInvalidMeta},
		{"too large", Meta{PeerAddr: long, APIAddr: long}, ErrMetaTooLarge},
		{"GPU model at its limit", Meta{GPUs: GPUs{Count: 1, Model: strings.Repeat("m", MaxGPUModelLen)}}, nil},
		{"GPU model past its limit", Meta{GPUs: GPUs{Count: 1, Model: strings.Repeat("m", MaxGPUModelLen+1)}}, ErrInvalidMeta},
		{"a NIC per GPU", Meta{GPUs: GPUs{Count: 2, NICs: 2}}, nil},
		{"more NICs than GPUs", Meta{GPUs: GPUs{Count: 2, NICs: 3}}, ErrInvalidMeta},
		{"pool bytes without a GPU", Meta{GPUs: GPUs{PoolBytes: 1}}, ErrInvalidMeta},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			if _, err := tc.m.MarshalBinary(); !errors.Is(err, tc.want) {
				t.Fatalf("MarshalBinary = %v, want %v", err, tc.want)
			}
		})
	}
}

// The GPU summary travels at the end of the metadata, only for a node
// with GPUs: a node without encodes exactly as before the section existed
// (a frozen sample of that encoding), so older nodes decode it. A section
// cut short, one of no GPUs, or a model that is not UTF-8 (it goes into
// status's proto strings) is malformed.
func TestMetaGPUs(t *testing.T) {
	plain := Meta{PeerAddr: "10.0.0.1:7000", Transports: TransportQUIC, LayoutDigest: 0x0102030405060708,
		Load: Load{KVUsage: 0.5, Waiting: 3, Imports: 2}, Incarnation: 9}
	const before = "01030d31302e302e302e313a37303030000108070605040302010080030209"
	plain.Load.KVUsage = math.Round(0.5*65535) / 65535 // what travels
	pb, err := plain.MarshalBinary()
	if err != nil || hex.EncodeToString(pb) != before {
		t.Fatalf("metadata without GPUs: %x, %v; want the encoding from before the GPU section, %s", pb, err, before)
	}
	var back Meta
	if err := back.UnmarshalBinary(pb); err != nil || back != plain {
		t.Fatalf("metadata without GPUs: %+v, %v", back, err)
	}
	m := plain
	m.GPUs = GPUs{Count: 4, PoolBytes: 3 << 34, NICs: 4, Model: "NVIDIA H200"}
	b, err := m.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	if err := back.UnmarshalBinary(b); err != nil || back != m {
		t.Fatalf("round trip: %+v, %v", back, err)
	}
	badUTF8 := append(append([]byte{}, pb...), 1, 0, 0, 2, 'A', 0xff)
	for _, bad := range [][]byte{b[:len(b)-1], append(append([]byte{}, pb...), 0), badUTF8} {
		if err := back.UnmarshalBinary(bad); !errors.Is(err, ErrMalformed) {
			t.Fatalf("metadata % x: %v, want ErrMalformed", bad, err)
		}
	}
	m.GPUs.Model = "NVIDIA \xff"
	if _, err := m.MarshalBinary(); !errors.Is(err, ErrInvalidMeta) {
		t.Fatalf("a model that is not UTF-8: %v, want ErrInvalidMeta", err)
	}
}

func TestStartChecksConfigAndMeta(t *testing.T) {
	long := "[fe80::1%" + strings.Repeat("z", 240) + "]:1"
	for _, tc := range []struct {
		desc  string
		tweak func(*Config)
		want  error
	}{
		{"no name", func(c *Config) { c.Name = "" }, ErrInvalidConfig},
		{"bad bind addr", func(c *Config) { c.BindAddr = "localhost" }, ErrInvalidConfig},
		{"cluster name past the label's bound", func(c *Config) { c.ClusterName = strings.Repeat("c", MaxClusterName+1) }, ErrInvalidConfig},
		{"bad key length", func(c *Config) { c.Keys = [][]byte{[]byte("short")} }, ErrInvalidConfig},
		{"probe timeout not below interval", func(c *Config) { c.ProbeTimeout = 2 * c.ProbeInterval }, ErrInvalidConfig},
		{"tiny batches", func(c *Config) { c.MaxBatchBytes = 10 }, ErrInvalidConfig},
		{"metadata over 512 bytes", func(c *Config) { c.Meta = Meta{PeerAddr: long, APIAddr: long} }, ErrMetaTooLarge},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			cfg := testConfig("x", 9)
			tc.tweak(&cfg)
			m, err := Start(context.Background(), cfg)
			if err == nil {
				m.Close()
			}
			if !errors.Is(err, tc.want) {
				t.Fatalf("Start = %v, want %v", err, tc.want)
			}
		})
	}
}

func TestLogDedupe(t *testing.T) {
	logs := &logCapture{}
	w := newLogWriter(slogNew(logs), time.Minute)
	now := time.Unix(0, 0)
	w.now = func() time.Time { return now }
	for port := range 50 {
		w.Write([]byte("2026/01/01 00:00:00 [ERR] memberlist: failed to receive: No installed keys could decrypt the message from=127.0.0.5:" + itoa(4000+port) + "\n"))
	}
	w.Write([]byte("[WARN] memberlist: Got ping for unexpected node x from=127.0.0.5:1\n"))
	w.Write([]byte("[DEBUG] memberlist: Stream connection from=127.0.0.5:1\n"))
	w.Write([]byte("[DEBUG] memberlist: Stream connection from=127.0.0.5:1\n"))
	if n := logs.matching("ERROR", "decrypt"); n != 1 {
		t.Fatalf("50 identical errors from different ports logged %d times, want once", n)
	}
	if n := logs.matching("WARN", "unexpected node"); n != 1 {
		t.Fatalf("distinct warning logged %d times, want once", n)
	}
	if n := logs.matching("DEBUG", "Stream connection"); n != 2 {
		t.Fatalf("debug lines are not deduplicated: got %d, want 2", n)
	}
	now = now.Add(2 * time.Minute)
	w.Write([]byte("[ERR] memberlist: failed to receive: No installed keys could decrypt the message from=127.0.0.5:1\n"))
	if n := logs.matching("ERROR", "decrypt"); n != 2 {
		t.Fatalf("after the window the error is logged again: got %d, want 2", n)
	}
}

func FuzzDecodeBye(f *testing.F) {
	f.Add(appendBye(nil, "node-1", 1<<40))
	f.Fuzz(func(t *testing.T, b []byte) {
		name, inc, err := decodeBye(b)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %v does not match ErrMalformed", err)
			}
			return
		}
		n2, i2, err := decodeBye(appendBye(nil, name, inc))
		if err != nil || n2 != name || i2 != inc {
			t.Fatalf("decode→encode→decode: %v, %q %d vs %q %d", err, name, inc, n2, i2)
		}
	})
}

// Metadata of exactly MetaMaxSize bytes encodes and decodes; one byte more
// is refused on both sides.
func TestMetaAtItsLimit(t *testing.T) {
	addr := func(n int) string { return "[fe80::1%" + strings.Repeat("z", n-12) + "]:1" } // n bytes
	meta := func(apiLen int) Meta {
		return Meta{PeerAddr: addr(MaxNameLen), APIAddr: addr(apiLen), Transports: TransportQUIC, LayoutDigest: 1, Incarnation: 1 << 62}
	}
	checkMetaAtLimit(t, meta)
}

// checkMetaAtLimit finds the API address length at which meta encodes to
// exactly MetaMaxSize bytes, checks that it round-trips there, and that
// one byte more is refused by the encoder and by a peer's decoder.
func checkMetaAtLimit(t *testing.T, meta func(apiLen int) Meta) {
	t.Helper()
	apiLen := 0
	for n := 12; n <= MaxNameLen; n++ {
		m := meta(n)
		if b, err := m.MarshalBinary(); err == nil && len(b) == MetaMaxSize {
			apiLen = n
			break
		}
	}
	if apiLen == 0 {
		t.Fatal("no metadata of exactly MetaMaxSize bytes could be built")
	}
	m := meta(apiLen)
	b, err := m.MarshalBinary()
	if err != nil || len(b) != MetaMaxSize {
		t.Fatalf("metadata at the limit: %d bytes, %v", len(b), err)
	}
	var back Meta
	if err := back.UnmarshalBinary(b); err != nil || back != m {
		t.Fatalf("metadata at the limit does not round-trip: %+v, %v", back, err)
	}
	over := meta(apiLen + 1)
	if _, err := over.MarshalBinary(); !errors.Is(err, ErrMetaTooLarge) {
		t.Fatalf("metadata one byte past the limit: err = %v, want ErrMetaTooLarge", err)
	}
	if err := back.UnmarshalBinary(append(b, 0)); err == nil {
		t.Fatal("a peer's metadata one byte past the limit was accepted")
	}
}

// The index mode travels after the GPU section, only for a node in owned
// mode: a node in whole mode encodes as before (TestMetaGPUs), one in
// owned mode without GPUs writes a GPU count of 0 before it. A mode byte
// unknown, owned slices of no replicas, or a section cut short are
// malformed.
func TestMetaIndexMode(t *testing.T) {
	plain := Meta{PeerAddr: "10.0.0.1:7000", Transports: TransportQUIC, Incarnation: 9}
	pb, err := plain.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		desc string
		m    Meta
		tail []byte // after the whole-mode encoding without GPUs
	}{
		{"owned, no GPUs", Meta{Index: IndexMode{Owned: true, Replicas: 3}}, []byte{0, 1, 3}},
		{"owned, 255 replicas", Meta{Index: IndexMode{Owned: true, Replicas: 255}}, []byte{0, 1, 255}},
		{"owned, with GPUs", Meta{GPUs: GPUs{Count: 2, PoolBytes: 5, NICs: 1, Model: "G"}, Index: IndexMode{Owned: true, Replicas: 2}},
			[]byte{2, 5, 1, 1, 'G', 1, 2}},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			m := plain
			m.GPUs, m.Index = tc.m.GPUs, tc.m.Index
			b, err := m.MarshalBinary()
			if err != nil {
				t.Fatal(err)
			}
			if want := append(append([]byte{}, pb...), tc.tail...); !bytes.Equal(b, want) {
				t.Fatalf("encoded % x, want % x", b, want)
			}
			var back Meta
			if err := back.UnmarshalBinary(b); err != nil || back != m {
				t.Fatalf("round trip: %+v, %v", back, err)
			}
		})
	}
	for _, bad := range [][]byte{{0, 2, 3}, {0, 1, 0}, {0, 1}, {0, 1, 3, 0}} {
		var back Meta
		if err := back.UnmarshalBinary(append(append([]byte{}, pb...), bad...)); !errors.Is(err, ErrMalformed) {
			t.Fatalf("metadata ending % x: %v, want ErrMalformed", bad, err)
		}
	}
	for _, x := range []IndexMode{{Owned: true}, {Replicas: 3}} {
		m := plain
		m.Index = x
		if _, err := m.MarshalBinary(); !errors.Is(err, ErrInvalidMeta) {
			t.Fatalf("index mode %+v: %v, want ErrInvalidMeta", x, err)
		}
	}
	if s := (IndexMode{}).String(); s != "whole" {
		t.Fatalf("whole mode named %q", s)
	}
	if s := (IndexMode{Owned: true, Replicas: 3}).String(); s != "owned/3" {
		t.Fatalf("owned mode named %q", s)
	}
}

// Metadata with every section (GPUs with a model at its limit, the index
// mode) fits memberlist's limit at exactly MetaMaxSize bytes, and is
// refused one byte past it.
func TestMetaWithEverySectionAtItsLimit(t *testing.T) {
	addr := func(n int) string { return "[fe80::1%" + strings.Repeat("z", n-12) + "]:1" } // n bytes
	meta := func(apiLen int) Meta {
		return Meta{PeerAddr: addr(MaxNameLen), APIAddr: addr(apiLen), Transports: TransportQUIC | TransportRDMA,
			LayoutDigest: 1, Load: Load{KVUsage: 1, Waiting: math.MaxUint32, Imports: math.MaxUint32}, Incarnation: math.MaxUint64,
			GPUs:  GPUs{Count: 255, PoolBytes: math.MaxUint64, NICs: 255, Model: strings.Repeat("m", MaxGPUModelLen)},
			Index: IndexMode{Owned: true, Replicas: 255}}
	}
	checkMetaAtLimit(t, meta)
}
