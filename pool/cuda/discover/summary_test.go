package discover

import (
	"strings"
	"testing"
)

func gpusOf(name string, gib uint64, n int) []GPU {
	out := make([]GPU, n)
	for i := range out {
		out[i] = GPU{Index: i, Name: name, MemoryTotal: gib << 30}
	}
	return out
}

func TestSummary(t *testing.T) {
	cases := []struct {
		desc string
		gpus []GPU
		want string
	}{
		{"none", nil, ""},
		{"one model", gpusOf("NVIDIA H100 80GB HBM3", 80, 8), "8xNVIDIA H100 80GB HBM3/80G"},
		{"two models in order", append(gpusOf("A", 40, 2), gpusOf("B", 80, 3)...), "2xA/40G,3xB/80G"},
		// "1x" + a 58-byte name + "/80G" is 64 bytes exactly.
		{"at the limit keeps names", gpusOf(strings.Repeat("n", 58), 80, 1), "1x" + strings.Repeat("n", 58) + "/80G"},
		{"past the limit drops names", gpusOf(strings.Repeat("n", 59), 80, 1), "1x80G"},
	}
	for _, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			got := Summary(c.gpus)
			if got != c.want || len(got) > MaxSummary {
				t.Errorf("Summary = %q (%d bytes), want %q", got, len(got), c.want)
			}
		})
	}
	// Many different memory sizes: even the short form is too long, and is
	// cut to MaxSummary bytes, marked.
	var many []GPU
	for i := range 20 {
		many = append(many, GPU{Name: "x", MemoryTotal: uint64(10+i) << 30})
	}
	got := Summary(many)
	if len(got) != MaxSummary || !strings.HasSuffix(got, "+") || !strings.HasPrefix(got, "1x10G,1x11G") {
		t.Errorf("Summary of 20 models = %q (%d bytes)", got, len(got))
	}
}

func TestByBusID(t *testing.T) {
	gpus := []GPU{{Index: 0, PCIBusID: "0000:9b:00.0"}, {Index: 1, PCIBusID: "0000:18:00.0"}}
	// The CUDA driver spells it "00000000:18:00.0".
	if g, ok := ByBusID(gpus, "00000000:18:00.0"); !ok || g.Index != 1 {
		t.Errorf("ByBusID(CUDA spelling) = %+v, %v", g, ok)
	}
	if g, ok := ByBusID(gpus, "0000:9B:00.0"); !ok || g.Index != 0 {
		t.Errorf("ByBusID(upper case) = %+v, %v", g, ok)
	}
	if _, ok := ByBusID(gpus, "0000:2a:00.0"); ok {
		t.Error("ByBusID found a GPU that is not there")
	}
}
