package fabric

import (
	"errors"
	"strings"
	"testing"
)

// fabric, fabric_provider and fabric_addr: each refusal names its field;
// the length limits hold at the limit and refuse one past it.
func TestValidateFabricConfig(t *testing.T) {
	for _, tc := range []struct {
		name  string
		mut   func(c *Config)
		field string // "" when valid
	}{
		{"default", func(c *Config) {}, ""},
		{"each fabric", func(c *Config) { c.Fabric = "verbs" }, ""},
		{"ofi with tcp", func(c *Config) { c.Fabric, c.FabricProvider, c.FabricAddr = "ofi", "tcp;ofi_rxm", "127.0.0.1" }, ""},
		{"auto with a provider", func(c *Config) { c.FabricProvider = "efa" }, ""},
		{"off", func(c *Config) { c.Fabric = "off" }, ""},
		{"off with rdma on", func(c *Config) { c.Fabric, c.RDMA = "off", "on" }, "fabric"},
		{"unknown fabric", func(c *Config) { c.Fabric = "ucx" }, "fabric"},
		{"provider with verbs", func(c *Config) { c.Fabric, c.FabricProvider = "verbs", "tcp" }, "fabric_provider"},
		{"address with off", func(c *Config) { c.Fabric, c.FabricAddr = "off", "127.0.0.1" }, "fabric_provider"},
		{"provider at its limit", func(c *Config) { c.FabricProvider = strings.Repeat("p", 64) }, ""},
		{"provider past its limit", func(c *Config) { c.FabricProvider = strings.Repeat("p", 65) }, "fabric_provider"},
		{"provider with a space", func(c *Config) { c.FabricProvider = "tcp shm" }, "fabric_provider"},
		{"address at its limit", func(c *Config) { c.FabricAddr = strings.Repeat("a", 255) }, ""},
		{"address past its limit", func(c *Config) { c.FabricAddr = strings.Repeat("a", 256) }, "fabric_addr"},
	} {
		c := DefaultLocalConfig()
		tc.mut(&c)
		c.populate()
		_, err := c.validate()
		switch {
		case tc.field == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.field != "" && (!errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tc.field)):
			t.Errorf("%s: %v, want ErrConfig naming %s", tc.name, err, tc.field)
		}
	}
	c := Config{}
	c.populate()
	if c.Fabric != "auto" {
		t.Errorf("zero fabric became %q, want auto", c.Fabric)
	}
}
