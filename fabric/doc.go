// Package fabric is the kvfabric node agent: it wires membership, the
// global block index, the pools, leases and the peer transport together,
// imports blocks from other nodes, and serves the engine API.
package fabric
