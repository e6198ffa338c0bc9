package fabric_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
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
	t.Run("engine socket", func(t *testing.T) {
		// A host pool: the descriptor socket, 3 bytes longer, binds too.
		at := func(t *testing.T, n int) fabric.Config {
			cfg := testConfig(t, "n1")
			cfg.EngineSocket = filepath.Join(cfg.DataDir, strings.Repeat("s", n-len(cfg.DataDir)-1))
			return cfg
		}
		a := startAgent(t, at(t, fabric.MaxEngineSocket))
		for _, p := range []string{a.EngineSocket(), a.EngineSocket() + fabric.FDSocketSuffix} {
			if fi, err := os.Stat(p); err != nil || fi.Mode()&os.ModeSocket == 0 {
				t.Errorf("%s (%d bytes): %v %v, want a socket", p, len(p), fi, err)
			}
		}
		var se *fabric.SettingError
		if _, err := fabric.Start(context.Background(), at(t, fabric.MaxEngineSocket+1)); !errors.As(err, &se) || se.Key != "engine_socket" {
			t.Fatalf("an engine socket of %d bytes: %v, want a SettingError about engine_socket", fabric.MaxEngineSocket+1, err)
		}
	})
}
