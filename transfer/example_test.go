package transfer_test

import (
	"context"
	"crypto/sha256"
	"fmt"
	"log"
	"time"

	"github.com/kvfabric/kvfabric/layout"
	"github.com/kvfabric/kvfabric/transfer"
	"github.com/kvfabric/kvfabric/transfer/certs"
)

// holder is the smallest Handler: one block set of one rank, whose first
// 4 KiB are leased under lease 1.
type holder struct{ region []byte }

func (h *holder) Hello(ctx context.Context, peer string, req transfer.HelloInfo) (transfer.HelloInfo, error) {
	return transfer.HelloInfo{Features: []string{"quic"}}, nil
}
func (h *holder) Layouts(ctx context.Context, peer string, digests [][]byte) ([]transfer.LayoutEntry, error) {
	return nil, nil
}
func (h *holder) Lease(ctx context.Context, peer string, hashes []uint64, d time.Duration) (transfer.Lease, error) {
	// A real holder names the digest of its block set's layout.
	digest := sha256.Sum256([]byte("layout of block set 0"))
	l := transfer.Lease{ID: 1, Duration: d, LayoutDigests: map[uint64][]byte{0: digest[:]}}
	for i, hash := range hashes {
		l.Blocks = append(l.Blocks, transfer.LeasedBlock{Hash: hash, Present: true, Slot: uint64(i)})
	}
	return l, nil
}
func (h *holder) Renew(ctx context.Context, peer string, id uint64, d time.Duration) (time.Duration, error) {
	if id != 1 {
		return 0, nil // no such lease, or it ended
	}
	return d, nil
}
func (h *holder) Release(ctx context.Context, peer string, id uint64) (bool, error) {
	return id == 1, nil
}
func (h *holder) EventRange(ctx context.Context, peer string, q transfer.EventQuery) (transfer.EventRange, error) {
	return transfer.EventRange{SnapshotNeeded: true}, nil
}
func (h *holder) CheckRead(peer string, lease, blockSet uint64, seg layout.Segment) error {
	return transfer.ForEachPiece(seg, func(off, n uint64) error {
		if lease != 1 || off+n > 4096 {
			return fmt.Errorf("%w: [%d, %d)", transfer.ErrLeaseRefused, off, off+n)
		}
		return nil
	})
}
func (h *holder) Region(blockSet uint64, rank int) ([]byte, error) {
	if blockSet != 0 || rank != 0 {
		return nil, transfer.ErrNotFound
	}
	return h.region, nil
}

func Example() {
	// One CA for the cluster (kvfabric certs ca), one certificate per node
	// (kvfabric certs node NAME).
	ca, err := certs.NewDevCA()
	if err != nil {
		log.Fatal(err)
	}
	node := func(name string, h transfer.Handler) *transfer.Node {
		pair, err := ca.IssueNode(name, 0)
		if err != nil {
			log.Fatal(err)
		}
		cert, err := pair.TLSCertificate()
		if err != nil {
			log.Fatal(err)
		}
		cfg := transfer.DefaultLocalConfig()
		cfg.NodeName = name
		cfg.Certificate = cert
		cfg.CAs = ca.Pool()
		cfg.Members = transfer.MemberFunc(func(n string) bool { return n == "a" || n == "b" })
		cfg.Handler = h
		n, err := transfer.NewNode(cfg)
		if err != nil {
			log.Fatal(err)
		}
		return n
	}
	region := make([]byte, 8192)
	for i := range region {
		region[i] = byte(i)
	}
	a := node("a", &holder{region: region})
	defer a.Close()
	b := node("b", nil)
	defer b.Close()

	ctx := context.Background()
	peer, err := b.Peer(ctx, a.Addr().String(), "a")
	if err != nil {
		log.Fatal(err)
	}
	defer peer.Close()
	lease, err := peer.Lease(ctx, []uint64{0xabc}, 5*time.Second)
	if err != nil {
		log.Fatal(err)
	}
	// Every other 16-byte row of the first 256 bytes, packed.
	dst := [][]byte{make([]byte, 128)}
	seg := layout.Segment{Length: 16, Count: 8, SrcStride: 32, DstStride: 16}
	if err := peer.Read(ctx, lease.ID, 0, []layout.Segment{seg}, dst); err != nil {
		log.Fatal(err)
	}
	valid, err := peer.Release(ctx, lease.ID)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(dst[0][16:20], valid)
	// Outside the lease: refused, nothing written.
	err = peer.Read(ctx, lease.ID, 0, []layout.Segment{{SrcOffset: 4096, Length: 16, Count: 1}}, dst)
	fmt.Println(err != nil)
	// Output:
	// [32 33 34 35] true
	// true
}
