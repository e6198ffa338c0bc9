package fabric

import (
	"fmt"
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
		return fmt.Errorf("%w: index_mode: %q is not whole or owned", ErrConfig, c.IndexMode)
	case c.IndexReplicas < 1 || c.IndexReplicas > MaxIndexReplicas:
		return fmt.Errorf("%w: index_replicas: %d not in 1..%d (0: %d)", ErrConfig, c.IndexReplicas, MaxIndexReplicas, DefaultIndexReplicas)
	case c.IndexMaxNodeBlocks < 1:
		return fmt.Errorf("%w: index_max_node_blocks: %d is not positive (0: %d)", ErrConfig, c.IndexMaxNodeBlocks, index.DefaultMaxNodeBlocks)
	}
	return nil
}
