//go:build cgo && linux

package transfer

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/kvfabric/kvfabric/layout"
)

// BenchmarkReadAcrossNICs reads a TP 2 chunk (one contiguous run per rank)
// over RDMA on softverbs, each rank's memory registered with a NIC of its
// own at both ends, so that the ranks move on their own queue pairs at
// once; and, in the same iteration, the same read with every region on one
// NIC of each node, the baseline. rails-x-one is the first's throughput
// over the baseline's. softverbs moves the bytes on the reading thread, a
// core per queue pair: the ratio shows the read path's parallelism, what a
// node with a NIC per GPU gains is the NICs' bandwidth added up.
//
//	go test ./transfer -run '^$' -bench ReadAcrossNICs -benchtime 20x
func BenchmarkReadAcrossNICs(b *testing.B) {
	lib, _ := softNIC(b)
	b.Setenv("SOFTVERBS_DEVICES", "sva,svb")
	const rank = 16 << 20
	type setup struct {
		peer     *Peer
		src, dst [][]byte
	}
	build := func(name string, nics []int) setup {
		ca := newTestCA(b)
		members := newMembers("holder-"+name, "reader-"+name)
		h := newMemHandler()
		src := [][]byte{make([]byte, rank), make([]byte, rank)}
		fill(src[0], 1)
		fill(src[1], 2)
		h.regions[7] = src
		leaseAll(h, 42, 2, rank)
		devs := []string{"sva", "svb"}
		holder := newTestNode(b, ca, "holder-"+name, members, h, withRDMADevices(b, lib, devs, nil))
		reader := newTestNode(b, ca, "reader-"+name, members, nil, withRDMADevices(b, lib, devs, nil))
		dst := [][]byte{make([]byte, rank), make([]byte, rank)}
		for r := range 2 {
			if _, err := holder.registerMemory(nics[r], src[r]); err != nil {
				b.Fatal(err)
			}
			if _, err := reader.registerMemory(nics[r], dst[r]); err != nil {
				b.Fatal(err)
			}
		}
		return setup{dialPeer(b, reader, holder), src, dst}
	}
	rails, one := build("rails", []int{0, 1}), build("one", []int{0, 0})
	segs := []layout.Segment{
		{SrcRank: 0, DstRank: 0, Length: rank, Count: 1, SrcStride: rank, DstStride: rank},
		{SrcRank: 1, DstRank: 1, Length: rank, Count: 1, SrcStride: rank, DstStride: rank},
	}
	ctx := context.Background()
	read := func(s setup) time.Duration {
		l, err := s.peer.Lease(ctx, []uint64{2}, 10*time.Second)
		if err != nil {
			b.Fatal(err)
		}
		start := time.Now()
		via, err := s.peer.ReadVia(ctx, l.ID, 7, segs, s.dst)
		took := time.Since(start)
		if err != nil || via != TransportRDMA {
			b.Fatalf("read over %s: %v", via, err)
		}
		if _, err := s.peer.Release(ctx, l.ID); err != nil {
			b.Fatal(err)
		}
		return took
	}
	// Connect the queue pairs and fault the pages in before timing, and
	// check the bytes.
	for _, s := range []setup{rails, one} {
		read(s)
		for r := range 2 {
			if !bytes.Equal(s.dst[r], s.src[r]) {
				b.Fatalf("rank %d read wrong", r)
			}
		}
	}
	var railsTime, oneTime time.Duration
	b.SetBytes(2 * rank)
	b.ResetTimer()
	for range b.N {
		railsTime += read(rails)
		oneTime += read(one)
	}
	b.StopTimer()
	gb := float64(2*rank) * float64(b.N) / 1e9
	b.ReportMetric(gb/railsTime.Seconds(), "rails-GB/s")
	b.ReportMetric(gb/oneTime.Seconds(), "one-nic-GB/s")
	b.ReportMetric(oneTime.Seconds()/railsTime.Seconds(), "rails-x-one")
	b.ReportMetric(0, "ns/op")
}
