package fabric_test

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// metricValue returns the value of the sample line that starts with
// name (labels included) in a /metrics body.
func metricValue(t *testing.T, body, name string) (float64, bool) {
	t.Helper()
	for _, line := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			var f float64
			if _, err := fmt.Sscan(v, &f); err != nil {
				t.Fatalf("/metrics: %q: %v", line, err)
			}
			return f, true
		}
	}
	return 0, false
}

// The node certificate's and the CA's expiry are exported, so that an
// alert can fire before peers start refusing the node.
func TestCertificateExpiryExported(t *testing.T) {
	a := startAgent(t, testConfig(t, "n1"))
	body := httpGet(t, "http://"+a.MetricsAddr()+"/metrics")
	now := time.Now()
	for _, c := range []struct {
		label string
		want  time.Duration // the development CA and certificate live 7 days
	}{{"node", 7 * 24 * time.Hour}, {"ca", 7 * 24 * time.Hour}} {
		v, ok := metricValue(t, body, `kvfabric_certificate_expiry_timestamp_seconds{certificate="`+c.label+`"}`)
		if !ok {
			t.Fatalf("/metrics has no expiry for the %s certificate", c.label)
		}
		at := time.Unix(int64(v), 0)
		if at.Before(now.Add(c.want-time.Hour)) || at.After(now.Add(c.want+time.Minute)) {
			t.Errorf("%s certificate expires at %v, want about %v from now", c.label, at, c.want)
		}
	}
}
