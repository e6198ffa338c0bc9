package transfer

import "sync/atomic"

// Metrics is a snapshot of a node's counters since it started.
type Metrics struct {
	// StreamsAccepted counts calls peers opened to this node.
	StreamsAccepted uint64
	// CallsServed counts control calls answered with success.
	CallsServed uint64
	// CallsFailed counts incoming calls answered with an error or reset.
	CallsFailed uint64
	// ReadsServed and BytesServed count reads served in full, over QUIC
	// or a TCP lane, each once its answer's last byte is written (on a TLS
	// lane, once the records gathered for it are flushed): possibly after
	// the reader has it and its Read has returned. BytesServedQUIC and
	// BytesServedLane are the parts of BytesServed served over each, each
	// counted on its own (as BytesReadQUIC is: a difference of snapshots
	// taken apart may wrap).
	ReadsServed     uint64
	BytesServed     uint64
	BytesServedQUIC uint64
	BytesServedLane uint64
	// Reads and BytesRead count this node's own reads completed in full,
	// over either transport; BytesReadQUIC is the part of BytesRead that
	// moved over QUIC. It is counted on its own, not as BytesRead less
	// RDMAMetrics.Bytes: the two snapshots are taken apart, and an RDMA
	// read completing between them would make that difference wrap.
	Reads         uint64
	BytesRead     uint64
	BytesReadQUIC uint64
	// ReadsFailed counts this node's own reads that returned an error.
	ReadsFailed uint64
	// RequestBytes is the request bytes charged now, all peers together:
	// the announced lengths of the request frames being read or decoded
	// (their buffers hold at most what has arrived); each peer's share is
	// capped by MaxPeerRequestBytes.
	RequestBytes uint64
	// RequestBudgetWaits counts requests that waited because their peer's
	// request bytes were at the cap.
	RequestBudgetWaits uint64

	// Handshakes are incoming handshakes in progress, HandshakesPeak the
	// most seen at once, Conns the incoming connections (handshaking or
	// established); ConnsRefused counts those refused for passing a bound
	// (Config.MaxHandshakes and the rest), AddressValidations the
	// handshakes asked to validate their source address under load.
	Handshakes, HandshakesPeak, Conns int
	ConnsRefused, AddressValidations  uint64

	// BytesReadLane is the part of BytesRead that moved over TCP lanes.
	BytesReadLane uint64
	// LaneConnects and LaneConnectFailures count lane connections this
	// node opened to holders, and those that failed (dial, handshake or
	// token refused).
	LaneConnects, LaneConnectFailures uint64
	// LaneRefused counts lane connections to this node refused after
	// their handshake: hellos with a bad token, name or membership,
	// connections past MaxLaneConns, a first frame that is not a well
	// formed hello, a hello late (past LaneHelloTimeout) or missing (the
	// connection closed first) after the TLS handshake or, on a plain
	// lane, after the accept, and a hello that arrived as the lane closed
	// at shutdown (a failed handshake, a bad certificate among them, is
	// counted in LaneHandshakeFailures).
	LaneRefused uint64
	// LanePending is the lane connections to this node not yet admitted
	// (TLS handshake and hello under way); LanePendingRefused counts those
	// closed as soon as they were accepted for passing the bounds on them
	// (Config.LaneMaxPending, LaneMaxPendingPerSource): a flood of
	// connections that do not authenticate.
	LanePending        int
	LanePendingRefused uint64
	// LaneHandshakeFailures counts lane connections to this node whose
	// TLS handshake failed or did not finish within Config.LaneHelloTimeout
	// (a bad certificate, a scanner, a stalled flood).
	LaneHandshakeFailures uint64
	// LaneAcceptErrors counts the lane's failed accepts (out of
	// descriptors, buffers or memory); the lane accepts again after a wait.
	LaneAcceptErrors uint64
	// LaneFallbacks counts reads that went over QUIC where the lane was
	// on, by reason (LaneFallbackReasons).
	LaneFallbacks map[string]uint64
	// LanePlain says the lane this node serves is plain TCP.
	LanePlain bool
}

type counters struct {
	streams, callsServed, callsFailed, readsServed, bytesServed atomic.Uint64
	reads, bytesRead, bytesReadQUIC, readsFailed, budgetWaits   atomic.Uint64
	requestBytes                                                atomic.Int64
	bytesReadLane, laneConnects, laneConnectFails, laneRefused  atomic.Uint64
	bytesServedQUIC, bytesServedLane                            atomic.Uint64
	laneFallbacks                                               [len(laneFallbackReasons)]atomic.Uint64 // one per reason
}

// laneFallback counts a read that went over QUIC for reason.
func (n *Node) laneFallback(reason string) {
	for i, r := range laneFallbackReasons {
		if r == reason {
			n.stats.laneFallbacks[i].Add(1)
		}
	}
}

// Metrics returns a snapshot of the node's counters.
func (n *Node) Metrics() Metrics {
	s := &n.stats
	var m Metrics
	if n.guard != nil {
		m.Handshakes, m.HandshakesPeak, m.Conns, m.ConnsRefused, m.AddressValidations = n.guard.snapshot()
	}
	fb := make(map[string]uint64, len(laneFallbackReasons))
	for i, r := range laneFallbackReasons {
		fb[r] = s.laneFallbacks[i].Load()
	}
	out := Metrics{
		Handshakes: m.Handshakes, HandshakesPeak: m.HandshakesPeak, Conns: m.Conns, ConnsRefused: m.ConnsRefused,
		AddressValidations: m.AddressValidations,
		BytesReadLane:      s.bytesReadLane.Load(), LaneConnects: s.laneConnects.Load(), LaneConnectFailures: s.laneConnectFails.Load(),
		LaneRefused: s.laneRefused.Load(), LaneFallbacks: fb, LanePlain: n.LanePlain(),
		StreamsAccepted: s.streams.Load(), CallsServed: s.callsServed.Load(), CallsFailed: s.callsFailed.Load(),
		ReadsServed: s.readsServed.Load(), BytesServed: s.bytesServed.Load(),
		BytesServedQUIC: s.bytesServedQUIC.Load(), BytesServedLane: s.bytesServedLane.Load(),
		Reads: s.reads.Load(), BytesRead: s.bytesRead.Load(), BytesReadQUIC: s.bytesReadQUIC.Load(), ReadsFailed: s.readsFailed.Load(),
		RequestBytes: uint64(max(0, s.requestBytes.Load())), RequestBudgetWaits: s.budgetWaits.Load(),
	}
	n.laneMetrics(&out)
	return out
}
