package client

import (
	"github.com/kvfabric/kvfabric/layout"
	"github.com/kvfabric/kvfabric/layout/layoutpb"
)

func layoutKVOrder(o layout.KVOrder) layoutpb.KVOrder { return layoutpb.KVOrder(o) }

func layoutArrangement(a layout.Arrangement) layoutpb.Arrangement { return layoutpb.Arrangement(a) }
