package fabric

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/kvfabric/kvfabric/membership"
	"github.com/kvfabric/kvfabric/pool"
	"github.com/kvfabric/kvfabric/transfer"
	"github.com/kvfabric/kvfabric/transfer/certs"
)

// startTransport starts the QUIC peer transport with the node's TLS
// identity: the configured files, or a development CA shared through the
// data dir's parent with --dev.
func (a *Agent) startTransport() error {
	cert, cas, err := a.tlsIdentity()
	if err != nil {
		return err
	}
	tcfg := transfer.DefaultConfig()
	if a.cfg.Local {
		tcfg = transfer.DefaultLocalConfig()
	}
	tcfg.NodeName = a.cfg.NodeName
	tcfg.ListenAddr = a.cfg.PeerAddr
	tcfg.Certificate = cert
	tcfg.CAs = cas
	tcfg.Members = transfer.MemberFunc(a.isMember)
	tcfg.Handler = a.holder
	tcfg.Logger = a.log
	// An import fails over from a silent holder within PeerTimeout: any
	// call to it (dial, control call, read) gives up after half of it,
	// leaving the other half to start on the next holder.
	half := a.cfg.PeerTimeout / 2
	tcfg.HandshakeTimeout = half
	tcfg.CallTimeout = half
	tcfg.ProgressTimeout = half
	tcfg.IdleTimeout = 3 * a.cfg.PeerTimeout
	n, err := transfer.NewNode(tcfg)
	if err != nil {
		return fmt.Errorf("fabric: peer transport: %w", err)
	}
	a.transport = n
	return nil
}

func (a *Agent) tlsIdentity() (tls.Certificate, *x509.CertPool, error) {
	c := &a.cfg
	if c.CAFile != "" || c.CertFile != "" || c.KeyFile != "" {
		pair, err := certs.LoadPair(c.CertFile, c.KeyFile)
		if err != nil {
			return tls.Certificate{}, nil, fmt.Errorf("fabric: node certificate: %w", err)
		}
		cert, err := pair.TLSCertificate()
		if err != nil {
			return tls.Certificate{}, nil, fmt.Errorf("fabric: node certificate: %w", err)
		}
		cas, err := certs.LoadPool(c.CAFile)
		if err != nil {
			return tls.Certificate{}, nil, fmt.Errorf("fabric: cluster CA: %w", err)
		}
		return cert, cas, nil
	}
	dir := c.DevCADir
	ca, created, err := certs.EnsureDevCA(dir)
	if err != nil {
		return tls.Certificate{}, nil, fmt.Errorf("fabric: development CA in %s: %w", dir, err)
	}
	a.log.Warn("DEVELOPMENT MODE: peers are authenticated by a development CA that anyone on this machine can read; "+
		"use kvfabric certs and --ca/--cert/--key on a real cluster", "dev_ca", dir, "created", created)
	pair, err := ca.IssueNode(c.NodeName, 7*24*time.Hour)
	if err != nil {
		return tls.Certificate{}, nil, fmt.Errorf("fabric: development certificate: %w", err)
	}
	cert, err := pair.TLSCertificate()
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	return cert, ca.Pool(), nil
}

// startMembership joins the cluster with the index as the sink of every
// node's block events and the peer transport as the repairer of gaps.
func (a *Agent) startMembership(ctx context.Context) error {
	mcfg := membership.DefaultConfig()
	if a.cfg.Local {
		mcfg = membership.DefaultLocalConfig()
	}
	host, port, err := splitHostPort(a.cfg.GossipAddr) // validated
	if err != nil {
		return fmt.Errorf("%w: gossip_addr: %v", ErrConfig, err)
	}
	mcfg.Name = a.cfg.NodeName
	mcfg.BindAddr, mcfg.BindPort = host, port
	if a.cfg.GossipAdvertise != "" {
		if mcfg.AdvertiseAddr, mcfg.AdvertisePort, err = splitHostPort(a.cfg.GossipAdvertise); err != nil {
			return fmt.Errorf("%w: gossip_advertise: %v", ErrConfig, err)
		}
	}
	mcfg.Seeds = a.cfg.Join
	mcfg.ClusterName = a.cfg.ClusterName
	if a.cfg.GossipKeyFile != "" {
		if mcfg.Keys, err = readKeys(a.cfg.GossipKeyFile); err != nil {
			return err
		}
	} else {
		a.log.Warn("gossip is not encrypted: give --gossip-key-file on a shared network")
	}
	mcfg.Sink = indexSink{a}
	mcfg.Repairer = repairer{a}
	mcfg.Logger = a.baseLog
	mcfg.Meta = a.meta()
	m, err := membership.Start(ctx, mcfg)
	if err != nil {
		return fmt.Errorf("fabric: membership: %w", err)
	}
	a.members = m
	return nil
}

// readKeys reads base64 gossip keys, one per line, the first the primary.
func readKeys(path string) ([][]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("%w: gossip key file: %v", ErrConfig, err)
	}
	defer f.Close()
	var keys [][]byte
	sc := bufio.NewScanner(f)
	for line := 1; sc.Scan(); line++ {
		s := strings.TrimSpace(sc.Text())
		if s == "" || strings.HasPrefix(s, "#") {
			continue
		}
		k, err := base64.StdEncoding.DecodeString(s)
		if err != nil || (len(k) != 16 && len(k) != 24 && len(k) != 32) {
			return nil, fmt.Errorf("%w: gossip key file %s line %d: not a base64 key of 16, 24 or 32 bytes", ErrConfig, path, line)
		}
		keys = append(keys, k)
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("%w: gossip key file %s holds no key", ErrConfig, path)
	}
	return keys, sc.Err()
}

// peerAdvertise is the address peers dial: the configured one, else the
// transport's, with a wildcard host replaced by gossip's.
func (a *Agent) peerAdvertise() string {
	if a.cfg.PeerAdvertise != "" {
		return a.cfg.PeerAdvertise
	}
	addr := a.transport.Addr().String()
	host, port, _ := net.SplitHostPort(addr)
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		host = a.cfg.GossipAdvertise
		if h, _, err := net.SplitHostPort(host); err == nil {
			host = h
		} else if a.members != nil {
			host = a.members.Addr().Addr().String()
		}
	}
	return net.JoinHostPort(host, port)
}

// meta is what this node tells the cluster about itself.
func (a *Agent) meta() membership.Meta {
	m := a.pool.Metrics()
	d := a.layoutSetDigest()
	return membership.Meta{
		PeerAddr:     a.peerAdvertise(),
		Transports:   membership.TransportQUIC,
		LayoutDigest: binary.LittleEndian.Uint64(d[:8]),
		Load:         membership.Load{KVUsage: m.Utilization, Imports: uint32(a.stats.inflight.Load())},
	}
}

// metaLoop gossips the node's metadata when it changes: layouts at once,
// load at most every second.
func (a *Agent) metaLoop() {
	defer a.wg.Done()
	t := time.NewTicker(time.Second)
	defer t.Stop()
	last := a.meta()
	for {
		select {
		case <-a.done:
			return
		case <-a.metaPoke:
		case <-t.C:
		}
		m := a.meta()
		if m == last {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		if err := a.members.SetMeta(ctx, m); err != nil && !errors.Is(err, membership.ErrClosed) {
			a.log.Debug("metadata not sent", "err", err)
		}
		cancel()
		last = m
	}
}

// pokeMeta asks metaLoop to send the metadata now.
func (a *Agent) pokeMeta() {
	select {
	case a.metaPoke <- struct{}{}:
	default:
	}
}

// isMember says whether a peer may talk to us: a current member.
func (a *Agent) isMember(name string) bool {
	_, ok := a.member(name)
	return ok
}

// member returns a current member by name.
func (a *Agent) member(name string) (membership.Member, bool) {
	m := a.joined.Load()
	if m == nil {
		return membership.Member{}, false
	}
	return m.Member(name)
}

// memberLoop closes the connections and forgets the layouts of members
// that leave or fail.
func (a *Agent) memberLoop() {
	defer a.wg.Done()
	for {
		select {
		case <-a.done:
			return
		case ev := <-a.members.Events():
			if ev.Kind == membership.MemberLeave || ev.Kind == membership.MemberFail {
				a.peers.forget(ev.Member.Name)
				a.layouts.forget(ev.Member.Name)
			}
		}
	}
}

// onPoolEvents publishes the local pool's store and remove events to the
// cluster. The pool calls it from its own goroutine; Publish queues and
// does not wait for the network.
func (a *Agent) onPoolEvents(b pool.EventBatch) {
	a.stats.events.Add(uint64(len(b.Events)))
	if b.Dropped > 0 {
		a.stats.eventsLost.Add(b.Dropped)
		a.log.Warn("pool events lost: the cluster's index misses some of this node's blocks until they are stored again", "lost", b.Dropped)
	}
	m := a.joined.Load()
	if m == nil {
		return
	}
	evs := b.Events
	for len(evs) > 0 {
		// Publish runs of one kind and block set together.
		n := 1
		for n < len(evs) && evs[n].Kind == evs[0].Kind && evs[n].Set == evs[0].Set {
			n++
		}
		kind := membership.EventStore
		if evs[0].Kind == pool.EventRemove {
			kind = membership.EventRemove
		}
		hashes := make([]uint64, n)
		for i := range n {
			hashes[i] = evs[i].Hash
		}
		if _, err := m.Publish(kind, uint32(evs[0].Set), hashes...); err != nil && !errors.Is(err, membership.ErrClosed) {
			a.log.Warn("events not published", "err", err)
		}
		evs = evs[n:]
	}
}

// indexSink applies every node's replicated events to the index. It runs
// on membership's goroutine and must not block.
type indexSink struct{ a *Agent }

func (s indexSink) Apply(events []membership.Event) {
	if len(events) == 0 {
		return
	}
	id, err := s.a.index.ID(events[0].Origin)
	if err != nil {
		s.a.log.Error("index full: events of a node not indexed", "peer", events[0].Origin, "err", err)
		return
	}
	for _, e := range events {
		if e.Kind == membership.EventStore {
			err = s.a.index.Store(id, e.Hash)
		} else {
			err = s.a.index.Remove(id, e.Hash)
		}
		if err != nil {
			s.a.log.Debug("index", "peer", e.Origin, "hash", e.Hash, "err", err)
		}
	}
}

func (s indexSink) Drop(origin string) {
	// Drop also precedes a snapshot repair of a live origin: only its
	// index entries go (memberLoop handles members that leave).
	if id, err := s.a.index.ID(origin); err == nil {
		s.a.index.DropNode(id)
	}
}

// repairer fetches what membership missed from the origin over QUIC.
type repairer struct{ a *Agent }

func (r repairer) peer(ctx context.Context, origin string) (*transfer.Peer, error) {
	m, ok := r.a.member(origin)
	if !ok || m.Meta.PeerAddr == "" {
		return nil, fmt.Errorf("fabric: %s is not a member with a peer address", origin)
	}
	return r.a.peers.get(ctx, r.a.transport, origin, m.Meta.PeerAddr)
}

func (r repairer) Events(ctx context.Context, origin string, inc, from, to uint64) ([]membership.Event, error) {
	p, err := r.peer(ctx, origin)
	if err != nil {
		return nil, err
	}
	er, err := p.EventRange(ctx, transfer.EventQuery{Origin: origin, Incarnation: inc, From: from, To: to + 1})
	if err != nil {
		return nil, err
	}
	if er.SnapshotNeeded {
		return nil, membership.ErrRangeGone
	}
	return decodeEvents(er.Events)
}

func (r repairer) Snapshot(ctx context.Context, origin string) (membership.Snapshot, error) {
	p, err := r.peer(ctx, origin)
	if err != nil {
		return membership.Snapshot{}, err
	}
	er, err := p.EventRange(ctx, transfer.EventQuery{Origin: origin, Snapshot: true})
	if err != nil {
		return membership.Snapshot{}, err
	}
	evs, err := decodeEvents(er.Events)
	if err != nil {
		return membership.Snapshot{}, err
	}
	s := membership.Snapshot{Origin: origin}
	if len(er.Events) > 0 {
		s.Seq = er.Events[0].Seq
	}
	for _, e := range evs {
		if e.Origin != origin {
			return membership.Snapshot{}, fmt.Errorf("fabric: snapshot of %s holds an event of %s", origin, e.Origin)
		}
		s.Incarnation = e.Incarnation
		s.Entries = append(s.Entries, membership.Entry{Hash: e.Hash, BlockSet: e.BlockSet})
	}
	return s, nil
}

func decodeEvents(wire []transfer.Event) ([]membership.Event, error) {
	var out []membership.Event
	for _, w := range wire {
		evs, err := membership.DecodeBatch(w.Payload)
		if err != nil {
			return nil, err
		}
		out = append(out, evs...)
	}
	return out, nil
}

// eventChunk bounds the events encoded in one payload of a repair answer.
const eventChunk = 4096

// eventRange serves a peer's repair from this node's own log.
func (a *Agent) eventRange(origin string, q transfer.EventQuery) (transfer.EventRange, error) {
	if origin != a.cfg.NodeName {
		return transfer.EventRange{}, fmt.Errorf("%w: this node serves only its own events, not %s's", transfer.ErrNotFound, origin)
	}
	m := a.joined.Load()
	if m == nil {
		return transfer.EventRange{}, fmt.Errorf("%w: not in the cluster", transfer.ErrUnavailable)
	}
	var evs []membership.Event
	var seq uint64
	if q.Snapshot {
		s := m.Snapshot()
		seq = s.Seq
		for _, e := range s.Entries {
			evs = append(evs, membership.Event{Origin: s.Origin, Incarnation: s.Incarnation, Seq: s.Seq,
				Kind: membership.EventStore, Hash: e.Hash, BlockSet: e.BlockSet})
		}
	} else {
		var err error
		evs, err = m.EventRange(q.Incarnation, q.From, q.To-1)
		if errors.Is(err, membership.ErrRangeGone) {
			return transfer.EventRange{SnapshotNeeded: true}, nil
		}
		if err != nil {
			return transfer.EventRange{}, err
		}
	}
	var out transfer.EventRange
	for len(evs) > 0 {
		n := min(len(evs), eventChunk)
		b, err := membership.AppendBatch(nil, evs[:n])
		if err != nil {
			return transfer.EventRange{}, err
		}
		// A chunk is numbered by its first event, so that the reader's
		// check of order holds; a snapshot's chunks all carry its Seq.
		s := evs[0].Seq
		if q.Snapshot {
			s = seq
		}
		out.Events = append(out.Events, transfer.Event{Seq: s, Payload: b})
		evs = evs[n:]
	}
	return out, nil
}

// devCADir is where --dev keeps the CA shared by the agents of one
// machine.
func devCADir(dataDir string) string {
	return filepath.Join(filepath.Dir(filepath.Clean(dataDir)), "kvfabric-dev-ca")
}
