package fabric

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/kvfabric/kvfabric/internal/pcitopo"
	"github.com/kvfabric/kvfabric/layout"
	"github.com/kvfabric/kvfabric/pool"
	"github.com/kvfabric/kvfabric/pool/cuda"
	"github.com/kvfabric/kvfabric/transfer"
)

// makeStorage makes the memory engines' block sets are carved from: GPU
// memory when specs ask for a device pool and the node has a GPU for it,
// else the host (or pinned) pool, host=1GiB when specs name none. A node
// without a CUDA driver or a GPU says so once and runs on host memory.
func (a *Agent) makeStorage(specs []PoolSpec) ([]pool.Storage, error) {
	hostSpec := PoolSpec{Kind: "host", Size: 1 << 30}
	var devSpecs []PoolSpec
	for _, s := range specs {
		if s.Kind == "device" {
			devSpecs = append(devSpecs, s)
		} else {
			hostSpec = s
		}
	}
	if len(devSpecs) > 0 || hostSpec.Kind == "pinned" {
		d, err := cuda.Open(cuda.Config{Path: a.cfg.CUDALibrary, Logger: a.log})
		switch {
		case err != nil && len(devSpecs) > 0:
			a.log.Info("no GPU: device pools off, engines' block sets are carved from host memory",
				"reason", err.Error(), "pool", fmt.Sprintf("%s=%d", hostSpec.Kind, hostSpec.Size))
		case err != nil:
			a.log.Info("no CUDA driver: the pinned pool is locked with mlock instead", "reason", err.Error())
		default:
			stage := uint64(stageServeBytes)
			if a.cfg.hooks.stageBytes > 0 {
				stage = a.cfg.hooks.stageBytes
			}
			a.staging, err = d.NewStagingBuffers(stage, maxStagingKept)
			if err != nil {
				d.Close()
				return nil, err
			}
			a.cuda = d
		}
	}
	if a.cuda == nil || len(devSpecs) == 0 {
		st, err := a.makeHostStorage(hostSpec)
		if err != nil {
			return nil, err
		}
		return []pool.Storage{st}, nil
	}
	return a.makeDeviceStorage(devSpecs)
}

// makeDeviceStorage allocates the device pools that devSpecs ask for, one
// per GPU, in GPU order: a block set's ranks are carved each from one of
// them (rank r from the r-th, unless the engine places them).
func (a *Agent) makeDeviceStorage(devSpecs []PoolSpec) (_ []pool.Storage, err error) {
	devs := a.cuda.Devices()
	wants := map[int]PoolSpec{}
	for _, s := range devSpecs {
		if s.GPU >= len(devs) {
			return nil, badSetting("pools", "device:%d: the CUDA driver (%s) reports %d GPUs (indices 0..%d)",
				s.GPU, a.cuda.Path(), len(devs), len(devs)-1)
		}
		for _, d := range devs {
			if s.GPU >= 0 && d.Index != s.GPU {
				continue
			}
			wants[d.Index] = s // config validation names each GPU once
		}
	}
	var out []pool.Storage
	defer func() {
		if err != nil {
			for _, m := range out {
				m.Close()
			}
			a.gpus = nil
		}
	}()
	for _, d := range devs {
		spec, ok := wants[d.Index]
		if !ok {
			continue
		}
		m, err := a.makeDevicePool(d, spec)
		if err != nil {
			return nil, err
		}
		out = append(out, m)
		a.gpus = append(a.gpus, d.Index)
	}
	a.poolKind = "device"
	return out, nil
}

// makeDevicePool allocates one GPU's device pool.
func (a *Agent) makeDevicePool(d cuda.DeviceInfo, spec PoolSpec) (*cuda.DeviceMemory, error) {
	size := spec.Size
	free, total, err := a.cuda.MemInfo(d.Index)
	if err != nil {
		return nil, fmt.Errorf("fabric: device pool on GPU %d: %w", d.Index, err)
	}
	if spec.Fraction > 0 {
		size = uint64(spec.Fraction * float64(free))
	}
	// Whole pages: dma-buf export and registration want them.
	page := uint64(os.Getpagesize())
	size &^= page - 1
	if size == 0 || size > free {
		return nil, badSetting("pools", "device:%d=%s: %d bytes asked, the GPU has %d free of %d",
			d.Index, amount(spec), size, free, total)
	}
	m, err := a.cuda.AllocDevice(d.Index, size)
	if err != nil {
		return nil, fmt.Errorf("fabric: device pool of %d bytes on GPU %d: %w", size, d.Index, err)
	}
	a.log.Info("device pool made", "gpu", d.Index, "name", d.Name, "pci_bus_id", d.PCIBusID, "bytes", size,
		"free_before", free, "dmabuf", d.Dmabuf, "driver", a.cuda.Path())
	return m, nil
}

// amount writes a device pool's size as the configuration gave it.
func amount(s PoolSpec) string {
	if s.Fraction > 0 {
		return fmt.Sprint(s.Fraction)
	}
	return fmt.Sprint(s.Size)
}

// readInto reads segs of the holder's block set set under lease id into
// dst: as host slices, or, for a block set in GPU memory, by address over
// RDMA, else over QUIC through pinned staging. landed, if not nil, is
// told of the parts a lane read brings into host slices (see
// transfer.ReadViaLanded).
func (a *Agent) readInto(ctx context.Context, peer *transfer.Peer, id, set uint64, segs []layout.Segment, dst *pool.BlockSet, landed transfer.Landed) (transfer.Transport, error) {
	l := dst.Layout()
	if l.Regions[0].Kind != layout.Device {
		regions, err := dst.RegionBytes()
		if err != nil {
			return transfer.TransportQUIC, localError{err}
		}
		return peer.ReadViaLanded(ctx, id, set, segs, regions, landed)
	}
	spans := make([]transfer.Span, len(l.Regions))
	for r, reg := range l.Regions {
		spans[r] = transfer.Span{Addr: reg.Base, Len: reg.Size}
	}
	via, err := peer.ReadSpans(ctx, id, set, segs, spans)
	if err == nil || ctx.Err() != nil {
		return via, err
	}
	// RDMA could not move it, or failed part way (the slots are not
	// registered; the staged read overwrites every byte the plan covers).
	if !errors.Is(err, transfer.ErrNeedsRDMA) {
		a.log.Warn("rdma read into the device pool failed; reading over QUIC through pinned staging", "peer", peer.Name(), "lease", id, "err", err)
	}
	return a.readStaged(ctx, peer, id, set, segs, l)
}

// copyOnDevice executes plan between two block sets of the device pools
// with the copy engines and waits for it: each destination GPU's ranks on
// a stream of that GPU, one 2-D copy per segment, a peer copy for a source
// rank on another GPU.
func (a *Agent) copyOnDevice(plan *layout.Plan, src, dst *layout.Layout) error {
	var gpus []int32
	sub := map[int32]*layout.Plan{}
	for r, segs := range plan.Ranks {
		if len(segs) == 0 {
			continue
		}
		g := dst.Regions[r].Device
		if sub[g] == nil {
			gpus = append(gpus, g)
			sub[g] = &layout.Plan{Ranks: make([][]layout.Segment, len(plan.Ranks))}
		}
		sub[g].Ranks[r] = segs
	}
	var streams []*cuda.Stream
	defer func() {
		for _, st := range streams {
			st.Close()
		}
	}()
	var errs []error
	for _, g := range gpus {
		st, err := a.cuda.NewStream(int(g))
		if err != nil {
			errs = append(errs, err)
			break
		}
		streams = append(streams, st)
		if err := st.ExecutePlan(cuda.DeviceToDevice, sub[g], deviceRegions(src), deviceRegions(dst)); err != nil {
			errs = append(errs, fmt.Errorf("fabric: copy into GPU %d: %w", g, err))
			break
		}
	}
	// Wait for what was queued, also after a failure: the caller aborts
	// the destination slots, which nothing may still be writing. A stream
	// that cannot be synchronised may still write them: errSlotUnsynced
	// says so, and the caller retires them instead.
	for _, st := range streams {
		if err := st.Synchronize(); err != nil {
			errs = append(errs, errSlotUnsynced, err)
		}
	}
	return errors.Join(errs...)
}

// placement turns a Register's devices, one per TP rank, into the pool
// storage of each rank: a GPU's PCI bus id or the agent's CUDA index, ""
// for the default (rank r on the r-th device pool, modulo their number).
// Empty devices, or a host pool, give nil: every rank by default.
func (a *Agent) placement(devices []string, tp int) ([]int, error) {
	if len(devices) == 0 || a.gpus == nil {
		return nil, nil
	}
	if len(devices) != tp {
		return nil, &layout.FieldError{Field: "devices", Reason: fmt.Sprintf("%d entries for TP %d: give one per rank, or none", len(devices), tp)}
	}
	infos := a.cuda.Devices()
	place := make([]int, tp)
	for r, d := range devices {
		place[r] = r % len(a.gpus)
		if d == "" {
			continue
		}
		found := -1
		for i, g := range a.gpus {
			if samePCIAddress(infos[g].PCIBusID, d) || strconv.Itoa(g) == d {
				found = i
			}
		}
		if found < 0 {
			var have []string
			for _, g := range a.gpus {
				have = append(have, fmt.Sprintf("%d (%s)", g, infos[g].PCIBusID))
			}
			return nil, &layout.FieldError{Field: fmt.Sprintf("devices[%d]", r),
				Reason: fmt.Sprintf("%q names no GPU with a device pool on this agent; pools are on GPUs %s", d, strings.Join(have, ", "))}
		}
		place[r] = found
	}
	return place, nil
}

// placedAs says whether set's ranks lie on the storages place names (nil:
// the default placement).
func (a *Agent) placedAs(set *pool.BlockSet, place []int) bool {
	n := len(set.Layout().Regions)
	if place != nil && len(place) != n {
		return false
	}
	storages := len(a.storages)
	for r := range n {
		want := r % storages
		if place != nil {
			want = place[r]
		}
		if got, err := set.RegionStorage(r); err != nil || got != want {
			return false
		}
	}
	return true
}

// samePCIAddress says whether two PCI addresses (domain:bus:device.function,
// hexadecimal) name the same device, whatever their case and the width of
// the domain: the driver writes "0000:18:00.0", NVML "00000000:18:00.0".
func samePCIAddress(a, b string) bool {
	pa, erra := pcitopo.ParseAddr(a)
	pb, errb := pcitopo.ParseAddr(b)
	return erra == nil && errb == nil && pa == pb
}
