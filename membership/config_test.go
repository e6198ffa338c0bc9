package membership

import (
	"testing"
	"time"
)

// PushPullPeriod scales the interval as memberlist's pushPullScale does:
// not up to 32 members, twice from 33 to 64, three times from 65 to 128.
func TestPushPullPeriod(t *testing.T) {
	for _, tc := range []struct {
		desc    string
		members int
		want    time.Duration
	}{
		{"alone", 1, 10 * time.Second},
		{"at the threshold", 32, 10 * time.Second},
		{"one past it", 33, 20 * time.Second},
		{"64", 64, 20 * time.Second},
		{"65", 65, 30 * time.Second},
		{"128", 128, 30 * time.Second},
		{"1,000", 1000, 60 * time.Second},
	} {
		if got := PushPullPeriod(10*time.Second, tc.members); got != tc.want {
			t.Errorf("%s: %d members: %v, want %v", tc.desc, tc.members, got, tc.want)
		}
	}
}
