package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"text/tabwriter"

	"github.com/kvfabric/kvfabric/rdma"
)

func runRDMA(e *env, args []string) error {
	if len(args) == 0 || strings.HasPrefix(args[0], "-") && args[0] != "-h" && args[0] != "--help" {
		return usagef("a subcommand is required: devices")
	}
	switch args[0] {
	case "-h", "--help":
		fmt.Fprintln(e.stderr, "Usage: kvfabric rdma devices [--library PATH] [--sysfs DIR] [--json]")
		return nil
	case "devices":
		return runRDMADevices(e, args[1:])
	}
	return usagef("unknown subcommand %q (want devices)", args[0])
}

func runRDMADevices(e *env, args []string) error {
	fs := newFlags(e, "rdma devices", "[--library PATH] [--sysfs DIR] [--json]", `
Lists the RDMA devices libibverbs finds, one line per port: state, link
layer, active MTU, link rate, LID, the GID a queue pair would send from
(RoCE v2 IPv4-mapped first, then RoCE v2 IPv6; none on InfiniBand), the
device's PCI function and NUMA node. Without RDMA it says why and exits 1.`)
	lib := fs.String("library", "", "libibverbs to open (empty: $"+rdma.EnvLibrary+", else "+rdma.DefaultLibrary+")")
	sysfs := fs.String("sysfs", "", "where sysfs is mounted (empty: /sys)")
	asJSON := fs.Bool("json", false, "print JSON for scripts instead of a table")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("unexpected argument %q", fs.Arg(0))
	}
	if *lib == "" {
		*lib = e.getenv(rdma.EnvLibrary)
	}
	l, err := rdma.Open(rdma.Config{Library: *lib, SysfsRoot: *sysfs})
	if err != nil {
		return err
	}
	defer l.Close()
	devs, err := l.Devices()
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(e.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(devicesJSON(devs))
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "DEVICE\tPORT\tSTATE\tLINK\tMTU\tRATE\tLID\tGID\tPCI\tNUMA")
	for _, d := range devs {
		pci, numa := orDash(d.PCIAddress), "-"
		if d.NUMANode >= 0 {
			numa = fmt.Sprint(d.NUMANode)
		}
		for _, p := range d.Ports {
			gid := "-"
			if p.LinkLayer == rdma.LinkLayerEthernet {
				if g, ok := p.PreferredGID(); ok {
					gid = fmt.Sprintf("%d %s (%s)", g.Index, g.String(), g.Type)
				} else {
					gid = "none usable (no RoCE v2 GID)"
				}
			}
			rate := "-"
			if p.Gbps > 0 {
				rate = fmt.Sprintf("%g Gb/s", p.Gbps)
			}
			lid := "-"
			if p.LinkLayer == rdma.LinkLayerInfiniBand {
				lid = fmt.Sprint(p.LID)
			}
			fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\n", d.Name, p.Number, p.State, p.LinkLayer, p.MTU, rate, lid, gid, pci, numa)
		}
	}
	return tw.Flush()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

type gidJSON struct {
	Index int    `json:"index"`
	GID   string `json:"gid"`
	Type  string `json:"type"`
}

type portJSON struct {
	Port      int       `json:"port"`
	State     string    `json:"state"`
	LinkLayer string    `json:"link_layer"`
	MTU       int       `json:"mtu"`
	Width     uint8     `json:"active_width"`
	Speed     uint8     `json:"active_speed"`
	Gbps      float64   `json:"gbps"`
	LID       uint16    `json:"lid"`
	GIDs      []gidJSON `json:"gids"`
}

type deviceJSON struct {
	Name       string     `json:"name"`
	GUID       string     `json:"guid"`
	Firmware   string     `json:"firmware"`
	PCIAddress string     `json:"pci_address,omitempty"`
	NUMANode   int        `json:"numa_node"`
	MaxQPWR    int        `json:"max_qp_wr"`
	MaxSGE     int        `json:"max_sge"`
	MaxCQE     int        `json:"max_cqe"`
	Ports      []portJSON `json:"ports"`
}

func devicesJSON(devs []rdma.DeviceInfo) []deviceJSON {
	out := make([]deviceJSON, 0, len(devs))
	for _, d := range devs {
		dj := deviceJSON{Name: d.Name, GUID: d.GUID, Firmware: d.Firmware, PCIAddress: d.PCIAddress, NUMANode: d.NUMANode,
			MaxQPWR: d.MaxQPWR, MaxSGE: d.MaxSGE, MaxCQE: d.MaxCQE, Ports: []portJSON{}}
		for _, p := range d.Ports {
			pj := portJSON{Port: p.Number, State: p.State, LinkLayer: p.LinkLayer.String(), MTU: p.MTU,
				Width: p.Width, Speed: p.Speed, Gbps: p.Gbps, LID: p.LID, GIDs: []gidJSON{}}
			for _, g := range p.GIDs {
				pj.GIDs = append(pj.GIDs, gidJSON{Index: g.Index, GID: g.String(), Type: g.Type.String()})
			}
			dj.Ports = append(dj.Ports, pj)
		}
		out = append(out, dj)
	}
	return out
}
