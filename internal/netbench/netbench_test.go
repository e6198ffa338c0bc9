package netbench

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"math/big"
	"net"
	"testing"
	"time"
)

func TestPercentile(t *testing.T) {
	ms := func(v ...int) []time.Duration {
		var out []time.Duration
		for _, x := range v {
			out = append(out, time.Duration(x)*time.Millisecond)
		}
		return out
	}
	hundred := make([]int, 100)
	for i := range hundred {
		hundred[i] = 100 - i // reversed: Percentile sorts
	}
	for _, c := range []struct {
		name string
		lat  []time.Duration
		p    float64
		want time.Duration
		ok   bool
	}{
		{"empty", nil, 50, 0, false},
		{"one", ms(7), 99, 7 * time.Millisecond, true},
		{"median of four is the second", ms(4, 1, 3, 2), 50, 2 * time.Millisecond, true},
		{"p99 of 100", ms(hundred...), 99, 99 * time.Millisecond, true},
		{"p100 is the max", ms(hundred...), 100, 100 * time.Millisecond, true},
		{"p0 is the min", ms(hundred...), 0, time.Millisecond, true},
		{"above 100 clamps", ms(1, 2), 150, 2 * time.Millisecond, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			before := append([]time.Duration(nil), c.lat...)
			got, ok := Percentile(c.lat, c.p)
			if got != c.want || ok != c.ok {
				t.Fatalf("Percentile(%v, %g) = %v, %v; want %v, %v", c.lat, c.p, got, ok, c.want, c.ok)
			}
			for i := range before {
				if before[i] != c.lat[i] {
					t.Fatal("Percentile reordered its argument")
				}
			}
		})
	}
}

// testTLS makes a self-signed certificate for "bench" and the configs of
// both ends.
func testTLS(t *testing.T) (server, client *tls.Config) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "bench"}, DNSNames: []string{"bench"},
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(leaf)
	cert := tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}
	server = &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"netbench"}, MinVersion: tls.VersionTLS13}
	client = &tls.Config{RootCAs: pool, ServerName: "bench", NextProtos: []string{"netbench"}, MinVersion: tls.VersionTLS13}
	return server, client
}

// TestBaselinesMoveEveryByte runs each baseline through the Runner and
// checks what arrived, byte for byte.
func TestBaselinesMoveEveryByte(t *testing.T) {
	const bs, nblocks = 48 << 10, 20
	src := make([]byte, bs*nblocks)
	rand.Read(src)
	dst := make([]byte, len(src))
	stls, ctls := testTLS(t)
	cfg := Config{Src: src, Dst: dst, BlockBytes: bs, Parallel: 3, Conns: 2, ServerTLS: stls, ClientTLS: ctls,
		ServerIP: net.IPv4(127, 0, 0, 1), UDPBuffer: 1 << 20}
	r := &Runner{BlockBytes: bs}
	defer r.Close()
	for _, mk := range []func(Config) (*Transport, error){NewQUIC, NewTLS, NewTCP} {
		tr, err := mk(cfg)
		if err != nil {
			t.Fatal(err)
		}
		tr.Batch = 3 // 20 blocks: the last batch is short
		r.Transports = append(r.Transports, tr)
	}
	ran := map[string]int{}
	r.Before = func(tr *Transport) error { clear(dst); return nil }
	r.After = func(tr *Transport) error {
		ran[tr.Name]++
		if !bytes.Equal(dst, src) {
			return errors.New("destination differs from source")
		}
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for range 2 {
		if err := r.Round(ctx, nblocks); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"quic", "tls", "tcp"} {
		res := r.Result(name)
		if ran[name] != 2 || res.Bytes != 2*bs*nblocks || len(res.Latencies) != 2*nblocks || res.GBps() <= 0 {
			t.Fatalf("%s: ran %d times, %d bytes, %d latencies, %g GB/s", name, ran[name], res.Bytes, len(res.Latencies), res.GBps())
		}
		for i, l := range res.Latencies {
			if l <= 0 {
				t.Fatalf("%s: block %d has no latency", name, i)
			}
		}
	}
	if x, err := r.Ratio("quic", "tcp"); err != nil || x <= 0 {
		t.Fatalf("ratio quic/tcp: %g, %v", x, err)
	}
	if _, err := r.Ratio("quic", "udp"); err == nil {
		t.Fatal("ratio to a transport that never ran: no error")
	}
	if err := r.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	if err := r.Close(); err != nil {
		t.Fatalf("second close: %v", err)
	}
}

// TestRunStopsAtFirstError checks that a failing fetch fails the run
// instead of hanging it, and that blocks outside Src are refused.
func TestRunStopsAtFirstError(t *testing.T) {
	boom := errors.New("boom")
	tr := &Transport{Name: "x", Parallel: 2, Fetch: func(ctx context.Context, w int, first, n uint64) error {
		if first == 5 {
			return boom
		}
		return nil
	}}
	if _, _, err := tr.Run(context.Background(), 1000); !errors.Is(err, boom) {
		t.Fatalf("run: %v, want boom", err)
	}
	if _, _, err := (&Transport{Name: "empty"}).Run(context.Background(), 1); err == nil {
		t.Fatal("transport without Fetch: no error")
	}
	src := make([]byte, 4096)
	if _, err := NewTCP(Config{Src: src, Dst: make([]byte, 10), BlockBytes: 1024}); err == nil {
		t.Fatal("short Dst: no error")
	}
	if _, err := NewQUIC(Config{Src: src, Dst: src, BlockBytes: 1024}); err == nil {
		t.Fatal("QUIC without TLS: no error")
	}
	if _, err := NewTCP(Config{Src: src, Dst: src}); err == nil {
		t.Fatal("zero BlockBytes: no error")
	}
	if _, err := block(src, 1024, 4); err == nil {
		t.Fatal("block 4 of 4: no error")
	}
}
