package fabric

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/kvfabric/kvfabric/layout"
	"github.com/kvfabric/kvfabric/pool"
	"github.com/kvfabric/kvfabric/pool/cuda"
	"github.com/kvfabric/kvfabric/transfer"
)

// makeStorage makes the memory engines' block sets are carved from: GPU
// memory when specs ask for a device pool and the node has a GPU for it,
// else the host (or pinned) pool, host=1GiB when specs name none. A node
// without a CUDA driver or a GPU says so once and runs on host memory.
func (a *Agent) makeStorage(specs []PoolSpec) (pool.Storage, error) {
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
			a.cuda = d
		}
	}
	if a.cuda == nil || len(devSpecs) == 0 {
		return a.makeHostStorage(hostSpec)
	}
	return a.makeDeviceStorage(devSpecs)
}

// makeDeviceStorage allocates the device pool that devSpecs ask for. Block
// sets do not span GPUs yet, so exactly one GPU must be asked for: a node
// with several names one with device:N.
func (a *Agent) makeDeviceStorage(devSpecs []PoolSpec) (pool.Storage, error) {
	devs := a.cuda.Devices()
	type want struct {
		gpu  int
		spec PoolSpec
	}
	var wants []want
	for _, s := range devSpecs {
		if s.GPU >= 0 {
			if s.GPU >= len(devs) {
				return nil, fmt.Errorf("%w: pools: device:%d: the CUDA driver (%s) reports %d GPUs (indices 0..%d)",
					ErrConfig, s.GPU, a.cuda.Path(), len(devs), len(devs)-1)
			}
			wants = append(wants, want{s.GPU, s})
			continue
		}
		for _, d := range devs {
			wants = append(wants, want{d.Index, s})
		}
	}
	if len(wants) != 1 {
		return nil, fmt.Errorf("%w: pools: device pools on %d GPUs: an agent carves block sets from one GPU's pool for now; name one with device:N=SIZE",
			ErrConfig, len(wants))
	}
	w := wants[0]
	size := w.spec.Size
	free, total, err := a.cuda.MemInfo(w.gpu)
	if err != nil {
		return nil, fmt.Errorf("fabric: device pool on GPU %d: %w", w.gpu, err)
	}
	if w.spec.Fraction > 0 {
		size = uint64(w.spec.Fraction * float64(free))
	}
	// Whole pages: dma-buf export and registration want them.
	page := uint64(os.Getpagesize())
	size &^= page - 1
	if size == 0 || size > free {
		return nil, fmt.Errorf("%w: pools: device:%d=%s: %d bytes asked, the GPU has %d free of %d",
			ErrConfig, w.gpu, amount(w.spec), size, free, total)
	}
	m, err := a.cuda.AllocDevice(w.gpu, size)
	if err != nil {
		return nil, fmt.Errorf("fabric: device pool of %d bytes on GPU %d: %w", size, w.gpu, err)
	}
	a.gpu, a.poolKind = w.gpu, "device"
	info := devs[w.gpu]
	a.log.Info("device pool made", "gpu", w.gpu, "name", info.Name, "pci_bus_id", info.PCIBusID, "bytes", size,
		"free_before", free, "dmabuf", info.Dmabuf, "driver", a.cuda.Path())
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
// RDMA, else over QUIC through pinned staging.
func (a *Agent) readInto(ctx context.Context, peer *transfer.Peer, id, set uint64, segs []layout.Segment, dst *pool.BlockSet) (transfer.Transport, error) {
	l := dst.Layout()
	if l.Regions[0].Kind != layout.Device {
		regions, err := dst.RegionBytes()
		if err != nil {
			return transfer.TransportQUIC, localError{err}
		}
		return peer.ReadVia(ctx, id, set, segs, regions)
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

// copyOnDevice executes plan between two block sets of the device pool
// with the GPU's copy engine (one 2-D copy per segment) and waits for it.
func (a *Agent) copyOnDevice(plan *layout.Plan, src, dst *layout.Layout) error {
	st, err := a.cuda.NewStream(a.gpu)
	if err != nil {
		return err
	}
	defer st.Close()
	if err := st.ExecutePlan(cuda.DeviceToDevice, plan, deviceRegions(src), deviceRegions(dst)); err != nil {
		return err
	}
	return st.Synchronize()
}
