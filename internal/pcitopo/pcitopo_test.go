package pcitopo_test

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvfabric/kvfabric/internal/pcitopo"
	"github.com/kvfabric/kvfabric/internal/pcitopo/pcitopotest"
)

func TestParseAddr(t *testing.T) {
	for _, tc := range []struct {
		desc, in, want string
	}{
		{"sysfs form", "0000:18:00.0", "0000:18:00.0"},
		{"NVML's eight-digit domain", "00000000:18:00.0", "0000:18:00.0"},
		{"upper case", "0000:9B:1F.7", "0000:9b:1f.7"},
		{"short domain", "1:2a:00.0", "0001:2a:00.0"},
		{"VMD domain beyond 16 bits", "10000:e1:00.0", "10000:e1:00.0"},
		{"largest", "ffffffff:ff:1f.7", "ffffffff:ff:1f.7"},
		{"device past 31", "0000:18:20.0", ""},
		{"function past 7", "0000:18:00.8", ""},
		{"domain of nine digits", "000000000:18:00.0", ""},
		{"bus of three digits", "0000:118:00.0", ""},
		{"no function", "0000:18:00", ""},
		{"two fields", "18:00.0", ""},
		{"empty field", "0000::00.0", ""},
		{"not hexadecimal", "0000:1g:00.0", ""},
		{"a sign", "0000:+1:00.0", ""},
		{"a name", "gpu0", ""},
		{"empty", "", ""},
	} {
		a, err := pcitopo.ParseAddr(tc.in)
		if tc.want == "" {
			if !errors.Is(err, pcitopo.ErrNotPCIAddress) {
				t.Errorf("%s: ParseAddr(%q) = %v, %v; want ErrNotPCIAddress", tc.desc, tc.in, a, err)
			}
			continue
		}
		if err != nil || a.String() != tc.want {
			t.Errorf("%s: ParseAddr(%q) = %v, %v; want %s", tc.desc, tc.in, a, err, tc.want)
		}
	}
}

func FuzzParseAddr(f *testing.F) {
	for _, s := range []string{"0000:18:00.0", "00000000:18:00.0", "1:2:3.4", "::.", "10000:e1:00.0"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		a, err := pcitopo.ParseAddr(s)
		if err != nil {
			return
		}
		b, err := pcitopo.ParseAddr(a.String())
		if err != nil || a != b {
			t.Fatalf("%q parsed to %v, whose string %q parses to %v, %v", s, a, a.String(), b, err)
		}
	})
}

func place(path string, numa int) pcitopo.Place {
	var p []string
	if path != "" {
		p = strings.Split(path, "/")
	}
	return pcitopo.Place{Path: p, NUMA: numa}
}

func TestDistance(t *testing.T) {
	gpu := place("pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0/0000:03:00.0", 0)
	for _, tc := range []struct {
		desc   string
		other  pcitopo.Place
		link   pcitopo.Link
		shared int
		hops   int
	}{
		{"other downstream port of the switch", place("pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:01.0/0000:04:00.0", 0), pcitopo.PIX, 3, 4},
		{"below a second switch", place("pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:02.0/0000:05:00.0/0000:06:00.0/0000:07:00.0", 0), pcitopo.PXB, 3, 6},
		{"same root port, no switch", place("pci0000:00/0000:00:01.0/0000:08:00.0", 0), pcitopo.PXB, 2, 4},
		{"another root port", place("pci0000:00/0000:00:02.0/0000:09:00.0", 0), pcitopo.PHB, 1, 6},
		{"another root complex, same node", place("pci0000:40/0000:40:01.0/0000:41:00.0", 0), pcitopo.NODE, 0, 0},
		{"another socket", place("pci0000:80/0000:80:01.0/0000:81:00.0", 1), pcitopo.SYS, 0, 0},
		{"no path, same node", place("", 0), pcitopo.NODE, 0, 0},
		{"no path, node unknown", place("", -1), pcitopo.SYS, 0, 0},
	} {
		l, s, h := pcitopo.Distance(gpu, tc.other)
		if l != tc.link || s != tc.shared || h != tc.hops {
			t.Errorf("%s: %v shared %d hops %d, want %v %d %d", tc.desc, l, s, h, tc.link, tc.shared, tc.hops)
		}
		if l2, s2, h2 := pcitopo.Distance(tc.other, gpu); l2 != l || s2 != s || h2 != h {
			t.Errorf("%s: not symmetric: %v %d %d one way, %v %d %d the other", tc.desc, l, s, h, l2, s2, h2)
		}
	}
}

// More bridges shared beats fewer hops: traffic between two functions of
// one switch never climbs to the root port.
func TestClosestPrefersSharedBridges(t *testing.T) {
	gpu := place("pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0/0000:03:00.0", 0)
	cands := []pcitopo.Place{
		place("pci0000:00/0000:00:01.0/0000:08:00.0", 0),                                                     // PXB, shared 2, hops 4
		place("pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:02.0/0000:05:00.0/0000:06:00.0/0000:07:00.0", 0), // PXB, shared 3, hops 6
		place("", 0),
	}
	if i, l := pcitopo.Closest(gpu, cands); i != 1 || l != pcitopo.PXB {
		t.Errorf("Closest = %d (%v), want 1 (PXB)", i, l)
	}
	if i, _ := pcitopo.Closest(gpu, nil); i != -1 {
		t.Errorf("Closest of none = %d, want -1", i)
	}
	// Ties go to the earliest.
	same := []pcitopo.Place{place("", 0), place("", 0)}
	if i, l := pcitopo.Closest(gpu, same); i != 0 || l != pcitopo.NODE {
		t.Errorf("tie: %d (%v), want 0 (NODE)", i, l)
	}
}

// On each machine shape, with NICs missing too, the nearest NIC found
// through sysfs is the machine's answer.
func TestClosestOnMachines(t *testing.T) {
	machines := map[string]func(testing.TB) *pcitopotest.Machine{
		"dgx-h100": func(t testing.TB) *pcitopotest.Machine { return pcitopotest.DGXH100(t, nil) },
		"dgx-h100 with GPUs 0,1,3,5 missing their NIC": func(t testing.TB) *pcitopotest.Machine {
			return pcitopotest.DGXH100(t, []bool{false, false, true, false, true, false, true, true})
		},
		"dgx-h100 with no compute NIC": func(t testing.TB) *pcitopotest.Machine { return pcitopotest.DGXH100(t, make([]bool, 8)) },
		"dual-socket pcie":             func(t testing.TB) *pcitopotest.Machine { return pcitopotest.DualSocketPCIe(t) },
	}
	for name, mk := range machines {
		t.Run(name, func(t *testing.T) {
			m := mk(t)
			var cands []pcitopo.Place
			for _, n := range m.NICs {
				p, err := pcitopo.LocateLink(m.Root, filepath.Join(m.Root, "class", "infiniband", n.Name, "device"))
				if err != nil {
					t.Fatal(err)
				}
				if a, ok := p.Addr(); !ok || a.String() != n.Addr || p.NUMA != n.NUMA {
					t.Fatalf("%s located at %v (NUMA %d), want %s (NUMA %d)", n.Name, a, p.NUMA, n.Addr, n.NUMA)
				}
				cands = append(cands, p)
			}
			for i, g := range m.GPUs {
				a, err := pcitopo.ParseAddr(g)
				if err != nil {
					t.Fatal(err)
				}
				p, err := pcitopo.Locate(m.Root, a)
				if err != nil {
					t.Fatal(err)
				}
				if p.NUMA != m.GPUNUMA[i] {
					t.Errorf("GPU %s: NUMA %d, want %d", g, p.NUMA, m.GPUNUMA[i])
				}
				best, link := pcitopo.Closest(p, cands)
				got := fmt.Sprintf("%s %v", m.NICs[best].Name, link)
				if want := m.Nearest[i].NIC + " " + m.Nearest[i].Link; got != want {
					t.Errorf("GPU %d (%s): nearest %s, want %s", i, g, got, want)
				}
			}
		})
	}
}

func TestLocateErrors(t *testing.T) {
	m := pcitopotest.DualSocketPCIe(t)
	if _, err := pcitopo.Locate(m.Root, pcitopo.Addr{Bus: 0x99}); err == nil {
		t.Error("a function not in sysfs: no error")
	}
	tr := pcitopotest.New(t)
	tr.Function("platform/serial8250", 0) // not below a root complex
	if _, err := pcitopo.LocateLink(tr.Root, filepath.Join(tr.Root, "bus", "pci", "devices", "serial8250")); err == nil {
		t.Error("a device outside the PCI tree: no error")
	}
}
