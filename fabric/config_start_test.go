package fabric_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/kvfabric/kvfabric/fabric"
	"github.com/kvfabric/kvfabric/membership"
)

// A setting at the limit validation gives it starts an agent, so that
// the limit is what the parts under it take, and one past it is refused
// before anything starts, naming the setting.
func TestSettingLimitsStart(t *testing.T) {
	t.Run("cluster name", func(t *testing.T) {
		cfg := testConfig(t, "n1")
		cfg.ClusterName = strings.Repeat("c", membership.MaxClusterName)
		startAgent(t, cfg) // memberlist takes it as its label
		cfg = testConfig(t, "n1")
		cfg.ClusterName = strings.Repeat("c", membership.MaxClusterName+1)
		var se *fabric.SettingError
		if _, err := fabric.Start(context.Background(), cfg); !errors.As(err, &se) || se.Key != "cluster_name" {
			t.Fatalf("a cluster name of %d bytes: %v, want a SettingError about cluster_name", len(cfg.ClusterName), err)
		}
	})
}
