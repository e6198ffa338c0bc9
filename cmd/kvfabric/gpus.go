package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/kvfabric/kvfabric/pool/cuda"
	"github.com/kvfabric/kvfabric/pool/cuda/discover"
)

// discoverGPUs and cudaDevices are replaced by tests.
var (
	discoverGPUs = discover.Discover
	cudaDevices  = func() ([]cuda.DeviceInfo, error) {
		d, err := cuda.Open(cuda.Config{})
		if err != nil {
			return nil, err
		}
		defer d.Close()
		return d.Devices(), nil
	}
)

// gpuRow is one GPU as NVML sees it, with what the CUDA driver says of the
// same device (matched by PCI bus id) when it can be loaded.
type gpuRow struct {
	discover.GPU
	// CUDAIndex is the CUDA ordinal, which may differ from NVML's index.
	CUDAIndex *int `json:"cuda_index,omitempty"`
	// Dmabuf says whether the device's memory can be exported as a dma-buf
	// for the NIC (GPUDirect without the peer-memory module).
	Dmabuf *bool `json:"dmabuf,omitempty"`
}

func runGPUs(e *env, args []string) error {
	fs := newFlags(e, "gpus", "[--json] [--sysfs DIR]", "Lists this node's GPUs as NVML reports them (name, UUID, memory, PCI bus id, NUMA node) with the RDMA device closest to each by PCI topology, and, where the CUDA driver loads (KVFABRIC_CUDA_LIB or libcuda.so.1), each one's CUDA index and dma-buf support. A node without NVML lists none and says why on stderr.")
	asJSON := fs.Bool("json", false, "print a JSON list instead of a table")
	sysfs := fs.String("sysfs", "/sys", "the sysfs mount to read the PCI topology from")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("gpus takes no arguments, got %q", fs.Args())
	}
	gpus, err := discoverGPUs(discover.Config{Sysfs: *sysfs})
	if errors.Is(err, discover.ErrNotSupported) {
		fmt.Fprintf(e.stderr, "kvfabric gpus: no GPUs: %v\n", err)
		gpus, err = nil, nil
	}
	if err != nil {
		return err
	}
	rows := make([]gpuRow, len(gpus))
	for i, g := range gpus {
		rows[i].GPU = g
	}
	if len(gpus) > 0 {
		devs, err := cudaDevices()
		if err != nil {
			fmt.Fprintf(e.stderr, "kvfabric gpus: CUDA driver: %v\n", err)
		}
		for _, dev := range devs {
			for i := range rows {
				if rows[i].PCIBusID == discover.NormalizeBusID(dev.PCIBusID) {
					rows[i].CUDAIndex, rows[i].Dmabuf = &dev.Index, &dev.Dmabuf
				}
			}
		}
	}
	if *asJSON {
		return json.NewEncoder(e.stdout).Encode(rows)
	}
	return printGPUs(e.stdout, rows)
}

func printGPUs(w io.Writer, rows []gpuRow) error {
	tw := table(w)
	fmt.Fprintln(tw, "GPU\tNAME\tUUID\tMEMORY\tFREE\tPCI\tNUMA\tNIC\tPATH\tCUDA\tDMABUF")
	for _, g := range rows {
		nic, path := g.NIC, g.NICPath
		if nic == "" {
			nic, path = "-", "-"
		}
		idx, dmabuf := "-", "-"
		if g.CUDAIndex != nil {
			idx = fmt.Sprint(*g.CUDAIndex)
			dmabuf = map[bool]string{true: "yes", false: "no"}[*g.Dmabuf]
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\n", g.Index, g.Name, g.UUID,
			gib(g.MemoryTotal), gib(g.MemoryFree), g.PCIBusID, g.NUMANode, nic, path, idx, dmabuf)
	}
	return tw.Flush()
}

func gib(n uint64) string { return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30)) }
