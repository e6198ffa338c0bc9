//go:build linux

package pool_test

import (
	"fmt"
	"time"

	"github.com/kvfabric/kvfabric/layout"
	"github.com/kvfabric/kvfabric/pool"
)

// An engine's block goes through its life while a peer leases and reads it.
func Example() {
	mem, err := pool.NewHostStorage(pool.HostConfig{Size: 1 << 20})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer mem.Close()
	p, err := pool.New(mem, pool.DefaultLocalConfig())
	if err != nil {
		fmt.Println(err)
		return
	}
	defer p.Close()
	set, err := p.NewBlockSet(&layout.Layout{
		Model:       layout.ModelConfig{Layers: 2, KVHeads: 4, HeadDim: 8, DType: layout.DTypeF16},
		PageSize:    4,
		TPSize:      2,
		Order:       layout.HND,
		Arrangement: layout.FullyContiguous,
		Alignment:   256,
		Slots:       8,
	})
	if err != nil {
		fmt.Println(err)
		return
	}

	// The engine: allocate, write through its mapping, commit, register.
	blks, _ := set.Allocate(1)
	regions, _ := set.RegionBytes() // [rank][]byte
	for r := range regions {
		regions[r][set.Layout().ChunkOffset(blks[0].Slot, 0, 0)] = 0xaa
	}
	set.Commit(blks[0])
	blk, _ := set.Register(blks[0], 0xfeed, 0)
	set.Release(blk) // the engine is done; the block stays cached, inactive

	// A peer: lease, check what it reads, release.
	id, got, _ := set.Lease([]uint64{0xfeed, 0xbeef}, 30*time.Second)
	shard := set.Layout().Strides().Shard
	fmt.Println("found:", got[0].Found, got[1].Found)
	fmt.Println("read shard:", p.CheckRead(id, set.ID(), 1, 0, shard) == nil)
	fmt.Println("read past it:", p.CheckRead(id, set.ID(), 1, 0, shard+1) == nil)
	valid, _ := p.ReleaseLease(id)
	fmt.Println("lease valid at release:", valid)
	m := p.Metrics()
	fmt.Println("registered:", m.Registered, "inactive:", m.Inactive)
	// Output:
	// found: true false
	// read shard: true
	// read past it: false
	// lease valid at release: true
	// registered: 1 inactive: 1
}
