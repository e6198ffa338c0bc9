package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/kvfabric/kvfabric/pool/cuda/discover"
)

// discoverGPUs is replaced by tests with a discovery on an NVML mock.
var discoverGPUs = discover.Discover

func runGPUs(e *env, args []string) error {
	fs := newFlags(e, "gpus", "[--json] [--sysfs DIR]", "Lists this node's GPUs as NVML reports them (name, UUID, memory, PCI bus id, NUMA node) with the RDMA device closest to each by PCI topology. A node without NVML lists none and says why on stderr.")
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
	if *asJSON {
		if gpus == nil {
			gpus = []discover.GPU{}
		}
		return json.NewEncoder(e.stdout).Encode(gpus)
	}
	return printGPUs(e.stdout, gpus)
}

func printGPUs(w io.Writer, gpus []discover.GPU) error {
	tw := table(w)
	fmt.Fprintln(tw, "GPU\tNAME\tUUID\tMEMORY\tFREE\tPCI\tNUMA\tNIC\tPATH")
	for _, g := range gpus {
		nic, path := g.NIC, g.NICPath
		if nic == "" {
			nic, path = "-", "-"
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", g.Index, g.Name, g.UUID,
			gib(g.MemoryTotal), gib(g.MemoryFree), g.PCIBusID, g.NUMANode, nic, path)
	}
	return tw.Flush()
}

func gib(n uint64) string { return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30)) }
