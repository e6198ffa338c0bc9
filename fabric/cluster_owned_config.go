package fabric

import (
	"time"

	"github.com/kvfabric/kvfabric/fabric/index"
)

// Index modes (Config.IndexMode).
const (
	IndexWhole = "whole"
	IndexOwned = "owned"
)

// Bounds of the owned-slices index's settings.
const (
	DefaultIndexReplicas = 3
	// MaxIndexReplicas is the most owners a hash may have: a placement
	// finds them without allocating up to this many.
	MaxIndexReplicas = index.MaxReplicas

	DefaultIndexCacheTTL = time.Second
	MinIndexCacheTTL     = time.Millisecond
	MaxIndexCacheTTL     = time.Minute
)

// populateIndexMode fills the index settings' defaults.
func (c *Config) populateIndexMode() {
	if c.IndexMode == "" {
		c.IndexMode = IndexWhole
	}
	if c.IndexReplicas == 0 {
		c.IndexReplicas = DefaultIndexReplicas
	}
	if c.IndexMaxNodeBlocks == 0 {
		c.IndexMaxNodeBlocks = index.DefaultMaxNodeBlocks
	}
}

// validateIndexMode checks the index settings of a populated config.
func (c *Config) validateIndexMode() error {
	switch {
	case c.IndexMode != IndexWhole && c.IndexMode != IndexOwned:
		return badSetting("index_mode", "%q is not whole or owned", c.IndexMode)
	case c.IndexReplicas < 1 || c.IndexReplicas > MaxIndexReplicas:
		return badSetting("index_replicas", "%d not in 1..%d (0: %d)", c.IndexReplicas, MaxIndexReplicas, DefaultIndexReplicas)
	case c.IndexMaxNodeBlocks < 1:
		return badSetting("index_max_node_blocks", "%d is not positive (0: %d)", c.IndexMaxNodeBlocks, index.DefaultMaxNodeBlocks)
	}
	return nil
}
