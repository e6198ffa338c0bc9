package client

import "testing"

// The agent and the engine may read bus ids from drivers that spell them
// differently; one device is one device.
func TestSamePCIAddress(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		same bool
	}{
		{"0000:3b:00.0", "00000000:3B:00.0", true},
		{"0000:3b:00.0", "0000:3b:00.1", false},
		{"0000:3b:00.0", "0001:3b:00.0", false},
		{"gpu-a", "GPU-A", true}, // not addresses: compared as text
		{"0000:3b:00.0", "gpu-a", false},
	} {
		if got := samePCIAddress(tc.a, tc.b); got != tc.same {
			t.Errorf("samePCIAddress(%q, %q) = %v", tc.a, tc.b, got)
		}
	}
}
