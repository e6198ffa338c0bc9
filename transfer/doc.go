// Package transfer is the kvfabric peer protocol over QUIC: mutual TLS
// against the cluster CA, control calls (hello, layouts, lease, renew,
// release, event-log range) and data reads that execute a plan's segments
// straight from the holder's region memory into the reader's.
//
// A [Node] owns one UDP socket that it listens on, and a few more that it
// dials from (one per connection slot, so that the several connections to a
// peer are received on several sockets). [Node.Peer] returns a [Peer] whose
// methods are the calls. The holder side calls a [Handler] that the agent
// implements; transfer never sees the pool.
//
// # Security
//
// Both ends present a certificate signed by the cluster CA whose common
// name is the node's name (see package certs), and the ALPN is
// "kvfabric/1". A connecting node is refused during the handshake unless
// [Members] says its name is a current member; the same check runs again on
// every stream, so a node that leaves the cluster loses its connections at
// its next call. A dialer checks that the holder's certificate names the
// node it meant to reach.
//
// # Wire
//
// Every call is one bidirectional QUIC stream. The caller writes one
// request frame and closes its side; the holder answers with one response
// frame and, for a read, the data:
//
//	request frame                    response frame
//	+--------+----------+---------+  +--------+----------+---------+
//	| method | length   | payload |  | status | length   | payload |
//	| 1 byte | u32 BE   | protobuf|  | 1 byte | u32 BE   | protobuf|
//	+--------+----------+---------+  +--------+----------+---------+
//
// method is one of the call numbers below; the payload is the matching
// transferpb request. status 0 is success with the matching transferpb
// response; status 1 is failure with a transferpb.Error (a code and a
// message). length is capped (Config.MaxMessageSize); a frame that is too
// long, truncated, of an unknown method or that does not decode and
// validate is answered with an Error and the stream is closed; the
// connection and the other calls carry on. A frame's buffer grows with the
// bytes that arrive, never to the length announced before they do. The
// announced lengths of one peer's requests in flight, across its
// connections, are capped (Config.MaxPeerRequestBytes): a request whose
// length would pass the cap waits, before its payload is read, for the
// peer's others to be decoded, in arrival order, and is refused as
// unavailable if it is not let in within ProgressTimeout of its stream
// opening, within which its whole frame must also arrive.
//
//	method  request                 response
//	1       HelloRequest            HelloResponse
//	2       LayoutsRequest          LayoutsResponse
//	3       LeaseRequest            LeaseResponse
//	4       RenewRequest            RenewResponse
//	5       ReleaseRequest          ReleaseResponse
//	6       EventRangeRequest       EventRangeResponse
//	7       ReadRequest             ReadResponse, then total_bytes of data
//	8       RdmaConnectRequest      RdmaConnectResponse
//	9       LaneTokenRequest        LaneTokenResponse
//	10      IndexRequest            IndexResponse
//
// An event-range request asks for at most MaxEventRange events (more is
// refused as too large), and an answer carries what fits one frame: one
// that stops short sets more, and the caller asks again from after it. A
// snapshot of the origin's holdings comes in pages the same way; the
// first answer names the snapshot (snapshot_seq) and each next request
// names it with the offset of the first entry still wanted.
//
// A read's data is the concatenation of every piece of every segment in
// request order. The holder checks every segment of the request against the
// region's bounds and the lease (through [Handler.CheckRead]) before it
// sends the response frame, so a refused request moves no byte.
//
// # Reads
//
// [Peer.Read] splits a plan into up to two parts per stream it may use
// (ConnsPerPeer × StreamsPerConn), of about equal size, none under
// MinStreamBytes (splitting strided segments between pieces and long pieces
// by bytes), and runs them as concurrent streams spread over the peer's
// connections, workers taking the next part as they finish one. The streams
// in flight to one peer, across all concurrent reads of a Peer, are capped
// at ConnsPerPeer × StreamsPerConn. The reader reads
// each piece straight into the destination slice of its rank; only small
// pieces pass through a 64 KiB buffer (and the holder gathers pieces under
// 16 KiB before writing them). A read of several parts that fails
// may have filled some of its destination ranges, never anything outside
// them.
//
// The kernel's UDP buffers limit QUIC at high rates; a node that cannot get
// 7 MiB buffers logs a warning with the sysctl command that raises the cap.
//
// # The TCP lane
//
// A node with Config.LaneAddr also serves reads on TCP, where QUIC's
// per-packet work and the kernel's UDP path limit a single peer. A reader
// asks the holder over QUIC (lane-token) for one-time tokens and the
// lane's port, opens up to Config.LaneConns connections to the port on
// the host of the holder's QUIC address, and presents a token in a
// LaneHello first frame on each. Connections speak TLS 1.3 with the
// node's certificate and CAs (ALPN LaneALPN; SetIdentity applies to the
// next ones) unless the holder's Config.LanePlain makes them plain TCP
// for a private network. The holder refuses a connection whose token is
// unknown, used, older than LaneTokenTTL or issued to another node (or,
// with TLS, to another node than its certificate names), from a node that
// is not a member, or past MaxLaneConns from one peer. Before that, a
// connection it accepted is pending: Config.LaneMaxPending of them in all
// and LaneMaxPendingPerSource from one source IP are allowed, one past
// either is closed as soon as it is accepted, before any TLS work
// (Metrics.LanePendingRefused), and the handshake, the hello and the
// answer to it must be done within Config.LaneHelloTimeout of the accept
// (a failed handshake counts in Metrics.LaneHandshakeFailures). A reader
// bounds the same steps, from its dial, by its own LaneHelloTimeout (or
// HandshakeTimeout, if less): it cannot know the holder's, and with the
// setting shared by a cluster's nodes it gives up no later than the
// holder would close the connection, then reads over QUIC
// (LaneFallbackHelloTimeout). A source
// is an IP address alone: nodes behind one address (a NAT) share its
// bound. A failed accept (out of descriptors, buffers or memory) is counted
// (Metrics.LaneAcceptErrors), and the lane accepts again after a wait.
//
// A connection then carries read requests (method 7), framed and
// answered in order as on QUIC, each of at most MaxLaneReadBytes of data,
// the reader writing the next request while it reads the answer to the
// one before; a refused request leaves the connection usable, anything
// else that goes wrong closes it. A read's plan is split into parts of at
// least 1 MiB, several per connection, over the peer's connections, and
// each piece is read straight into its destination (a plain connection
// reads its frames through a 16 KiB buffer and, on Linux, its pieces
// straight in, many to a readv). A holder closes a connection idle for
// Config.LaneIdleTimeout and one whose reader stops reading for
// ProgressTimeout; a reader fails a read whose holder sends nothing for
// ProgressTimeout. A reader that cannot get tokens, connect, or finish a
// read on the lane reads the same over QUIC and keeps to QUIC for
// LaneRetryAfter; Metrics.LaneFallbacks counts why. [Peer.ReadVia] says
// which transport moved a read: RDMA first where there is RDMA, then the
// lane, then QUIC.
//
// RDMA runs on one of two bindings, behind one read path: libibverbs'
// RC queue pairs (RDMAConfig.Devices), or a libfabric RDM endpoint
// (RDMAConfig.OFI: EFA, Slingshot's cxi, or libfabric's tcp and shm).
// A lease request names the reader's binding, and a holder hands its
// regions (with 64-bit keys, and its endpoint name, over libfabric) only
// to a reader of its own; across bindings reads take the lane or QUIC.
//
// # Deadlines
//
// Connections send keep-alives and close after IdleTimeout without a
// packet, so a vanished peer fails every call on that connection. A control
// call fails after CallTimeout, or at the caller's deadline when that comes
// first. A read fails when no
// byte has moved on one of its streams for ProgressTimeout, so a holder
// that stops answering (stalled handler, dead process, closed listener)
// fails the read within that bound however large the read is.
package transfer
