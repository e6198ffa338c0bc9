package fabric

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvfabric/kvfabric/fabric/index"
)

// The index settings are checked where they are set, with the setting
// named: each bound has a case at it and one past it.
func TestIndexModeConfig(t *testing.T) {
	for _, tc := range []struct {
		desc string
		mut  func(c *Config)
		bad  string // the setting named, "" if valid
	}{
		{"defaults", func(c *Config) {}, ""},
		{"owned, default replicas", func(c *Config) { c.IndexMode = IndexOwned }, ""},
		{"one replica", func(c *Config) { c.IndexMode, c.IndexReplicas = IndexOwned, 1 }, ""},
		{"the most replicas", func(c *Config) { c.IndexMode, c.IndexReplicas = IndexOwned, MaxIndexReplicas }, ""},
		{"one replica past the most", func(c *Config) { c.IndexMode, c.IndexReplicas = IndexOwned, MaxIndexReplicas+1 }, "index_replicas"},
		{"negative replicas", func(c *Config) { c.IndexReplicas = -1 }, "index_replicas"},
		{"unknown mode", func(c *Config) { c.IndexMode = "sharded" }, "index_mode"},
		{"cache TTL at its floor", func(c *Config) { c.IndexCacheTTL = MinIndexCacheTTL }, ""},
		{"cache TTL under its floor", func(c *Config) { c.IndexCacheTTL = MinIndexCacheTTL - 1 }, "index_cache_ttl"},
		{"cache TTL at its ceiling", func(c *Config) { c.IndexCacheTTL = MaxIndexCacheTTL }, ""},
		{"cache TTL over its ceiling", func(c *Config) { c.IndexCacheTTL = MaxIndexCacheTTL + 1 }, "index_cache_ttl"},
		{"one hash a node", func(c *Config) { c.IndexMaxNodeBlocks = 1 }, ""},
		{"negative hashes a node", func(c *Config) { c.IndexMaxNodeBlocks = -1 }, "index_max_node_blocks"},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			c := DefaultLocalConfig()
			tc.mut(&c)
			c.populate()
			_, err := c.validate()
			switch {
			case tc.bad == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.bad != "" && (!errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tc.bad)):
				t.Fatalf("err = %v, want an error naming %s", err, tc.bad)
			}
		})
	}
	c := DefaultLocalConfig()
	c.populate()
	if c.IndexMode != IndexWhole || c.IndexReplicas != DefaultIndexReplicas || c.IndexCacheTTL != DefaultIndexCacheTTL ||
		c.IndexMaxNodeBlocks != index.DefaultMaxNodeBlocks {
		t.Fatalf("defaults: mode %q, replicas %d, cache TTL %v, hashes a node %d", c.IndexMode, c.IndexReplicas, c.IndexCacheTTL, c.IndexMaxNodeBlocks)
	}
	// The file's keys.
	path := filepath.Join(t.TempDir(), "agent.json")
	os.WriteFile(path, []byte(`{"index_mode": "owned", "index_replicas": 5, "index_cache_ttl": "250ms", "index_max_node_blocks": 1000}`), 0o600)
	c, err := LoadConfigFile(path, DefaultConfig())
	if err != nil || c.IndexMode != IndexOwned || c.IndexReplicas != 5 || c.IndexCacheTTL != 250*time.Millisecond || c.IndexMaxNodeBlocks != 1000 {
		t.Fatalf("from a file: %q %d %v %d, %v", c.IndexMode, c.IndexReplicas, c.IndexCacheTTL, c.IndexMaxNodeBlocks, err)
	}
}
