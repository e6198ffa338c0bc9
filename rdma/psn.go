package rdma

import "math/rand/v2"

// newPSN picks a random 24-bit packet sequence number, so that a
// reconnected queue pair does not accept a stale packet of its last life.
func newPSN() uint32 { return rand.Uint32() & 0xffffff }
