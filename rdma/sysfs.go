package rdma

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/kvfabric/kvfabric/internal/pcitopo"
)

// devicePCI returns the PCI function and NUMA node sysfs gives for an RDMA
// device ("", -1 where it says nothing).
func devicePCI(sysfsRoot, dev string) (addr string, numa int) {
	if sysfsRoot == "" {
		sysfsRoot = "/sys"
	}
	link := filepath.Join(sysfsRoot, "class", "infiniband", dev, "device")
	p, err := pcitopo.LocateLink(sysfsRoot, link)
	if err != nil {
		// Not a PCI function (a software device): its node, if it says one.
		numa = -1
		if b, err := os.ReadFile(filepath.Join(link, "numa_node")); err == nil {
			if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && n >= 0 {
				numa = n
			}
		}
		return "", numa
	}
	if a, ok := p.Addr(); ok {
		addr = a.String()
	}
	return addr, p.NUMA
}

// gidTypeFromSysfs reads ports/<p>/gid_attrs/types/<i> ("IB/RoCE v1",
// "RoCE v2"); GIDTypeUnknown where the file is missing or unreadable.
func gidTypeFromSysfs(sysfsRoot, dev string, port, index int, ll LinkLayer) GIDType {
	b, err := os.ReadFile(filepath.Join(sysfsRoot, "class", "infiniband", dev, "ports", strconv.Itoa(port), "gid_attrs", "types", strconv.Itoa(index)))
	if err != nil {
		return GIDTypeUnknown
	}
	switch s := strings.TrimSpace(string(b)); {
	case strings.EqualFold(s, "RoCE v2"):
		return GIDTypeRoCEv2
	case strings.EqualFold(s, "IB/RoCE v1"):
		if ll == LinkLayerInfiniBand {
			return GIDTypeIB
		}
		return GIDTypeRoCEv1
	}
	return GIDTypeUnknown
}

// gidTypeFromForm guesses the type from the address when neither the
// library nor sysfs says: InfiniBand GIDs are IB; on Ethernet an
// IPv4-mapped address is taken as RoCE v2 and a link-local one as RoCE v1
// (the way drivers populate their tables), anything else stays unknown.
func gidTypeFromForm(g GID, ll LinkLayer) GIDType {
	switch {
	case ll == LinkLayerInfiniBand:
		return GIDTypeIB
	case g.IPv4Mapped():
		return GIDTypeRoCEv2
	case g.LinkLocal():
		return GIDTypeRoCEv1
	}
	return GIDTypeUnknown
}

// typesByRepeat corrects types guessed from the form: on Ethernet the
// kernel's GID table holds each address once per RoCE version, v1 first
// (mlx5: fe80 v1, fe80 v2, ::ffff:a.b.c.d v1, ::ffff:a.b.c.d v2), so of two
// entries with the same GID the lower index is RoCE v1 and the higher v2,
// whatever the form suggests. A GID that appears once keeps its guess.
func typesByRepeat(gids []GID, guessed []bool, ll LinkLayer) {
	if ll != LinkLayerEthernet {
		return
	}
	for i := range gids {
		if !guessed[i] {
			continue
		}
		for j := range gids {
			if j != i && gids[j].Raw == gids[i].Raw {
				if j > i {
					gids[i].Type = GIDTypeRoCEv1
				} else {
					gids[i].Type = GIDTypeRoCEv2
				}
				break
			}
		}
	}
}

// PreferredGID is the GID a queue pair on this port sends from, as
// OpenDevice chooses it; ok is false when none fits (an Ethernet port
// without a RoCE v2 GID).
func (p PortInfo) PreferredGID() (GID, bool) { return chooseGID(p) }

// chooseGID picks the GID a queue pair sends from: on Ethernet a RoCE v2
// IPv4-mapped GID, then a RoCE v2 IPv6 one (global before link-local); on
// InfiniBand the first GID (the LID addresses the peer). ok is false when
// nothing fits.
func chooseGID(p PortInfo) (GID, bool) {
	if p.LinkLayer == LinkLayerInfiniBand {
		if len(p.GIDs) > 0 {
			return p.GIDs[0], true
		}
		return GID{}, true
	}
	rank := func(g GID) int {
		switch {
		case g.Type != GIDTypeRoCEv2:
			return 0
		case g.IPv4Mapped():
			return 3
		case !g.LinkLocal():
			return 2
		}
		return 1
	}
	var best GID
	bestRank := 0
	for _, g := range p.GIDs {
		if r := rank(g); r > bestRank {
			best, bestRank = g, r
		}
	}
	return best, bestRank > 0
}
