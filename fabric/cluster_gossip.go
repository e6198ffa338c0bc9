package fabric

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/kvfabric/kvfabric/membership"
	"github.com/kvfabric/kvfabric/transfer"
)

// startMembership joins the cluster with the index as the sink of every
// node's block events and the peer transport as the repairer of gaps.
func (a *Agent) startMembership(ctx context.Context) error {
	mcfg := membership.DefaultConfig()
	if a.cfg.Local {
		mcfg = membership.DefaultLocalConfig()
	}
	host, port, err := splitHostPort(a.cfg.GossipAddr) // validated
	if err != nil {
		return badSettingErr("gossip_addr", err, "%v", err)
	}
	mcfg.Name = a.cfg.NodeName
	mcfg.BindAddr, mcfg.BindPort = host, port
	if a.cfg.GossipAdvertise != "" {
		if mcfg.AdvertiseAddr, mcfg.AdvertisePort, err = splitHostPort(a.cfg.GossipAdvertise); err != nil {
			return badSettingErr("gossip_advertise", err, "%v", err)
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
	sink := newIndexSink(a)
	a.sink = sink
	a.wg.Add(2)
	go sink.sweepLoop()
	go sink.demoteLoop()
	mcfg.Sink = sink
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
		return nil, badSettingErr("gossip_key_file", err, "%v", err)
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
			return nil, badSetting("gossip_key_file", "%s line %d: not a base64 key of 16, 24 or 32 bytes", path, line)
		}
		keys = append(keys, k)
	}
	if err := sc.Err(); err != nil {
		return nil, badSettingErr("gossip_key_file", err, "%s: %v", path, err)
	}
	if len(keys) == 0 {
		return nil, badSetting("gossip_key_file", "%s holds no key", path)
	}
	return keys, nil
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
	t := membership.TransportQUIC
	if a.transport != nil && a.transport.RDMAEnabled() {
		t |= membership.TransportRDMA
	}
	return membership.Meta{
		PeerAddr:     a.peerAdvertise(),
		Transports:   t,
		LayoutDigest: binary.LittleEndian.Uint64(d[:8]),
		Load:         membership.Load{KVUsage: m.Utilization, Imports: uint32(a.stats.inflight.Load())},
		GPUs:         a.gpuSummary(),
		Index:        a.indexModeMeta(),
	}
}

// gpuSummary is what the node's metadata says of its device pools: how
// many GPUs, their bytes, the RDMA devices they are registered with and
// the first GPU's name.
func (a *Agent) gpuSummary() membership.GPUs {
	if a.gpus == nil {
		return membership.GPUs{}
	}
	g := membership.GPUs{Count: uint8(min(len(a.gpus), 255)), Model: a.cuda.Devices()[a.gpus[0]].Name}
	g.Model = strings.ToValidUTF8(g.Model, "?")
	for len(g.Model) > membership.MaxGPUModelLen {
		_, n := utf8.DecodeLastRuneInString(g.Model)
		g.Model = g.Model[:len(g.Model)-n]
	}
	nics := map[string]bool{}
	for i, st := range a.storages {
		g.PoolBytes += st.Size()
		if a.poolDevice[i] != "" {
			nics[a.poolDevice[i]] = true
		}
	}
	g.NICs = uint8(min(len(nics), int(g.Count)))
	return g
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
		ctx, cancel := context.WithTimeout(a.ctx, time.Second)
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
// that leave or fail, and stops the agent if membership stops by itself
// (its node name turned out to be taken).
func (a *Agent) memberLoop() {
	defer a.wg.Done()
	failed := map[string]time.Time{} // members seen failing, until they come back or leave
	lives := map[string]uint64{}     // each member's incarnation, as last seen
	for {
		select {
		case <-a.done:
			return
		case <-a.members.Stopped():
			err := a.members.Err()
			a.log.Error("agent stopping: membership stopped", "err", err)
			a.stopErr.Store(&err)
			go a.Close() // Close waits for this goroutine
			return
		case ev := <-a.members.Events():
			a.logMember(ev, failed, time.Now())
			a.reportIndexMode(ev)
			name := ev.Member.Name
			if ev.Kind == membership.MemberLeave || ev.Kind == membership.MemberFail {
				delete(lives, name)
				a.peers.forget(name, goneReason(ev.Kind))
				a.health.forget(name)
				a.links.forget(name)
				a.service.peerGone(name, "member "+ev.Kind.String())
				continue
			}
			// A member that restarted before failure detection noticed
			// (a SIGKILL and a quick restart at the same address) has a
			// new incarnation, and the old process never answers on this
			// node's connections to it: dial afresh.
			inc := ev.Member.Meta.Incarnation
			if old, ok := lives[name]; ok && old != inc {
				a.log.Info("member restarted: its connections are dialed afresh", "peer", name)
				a.peers.forget(name, transfer.ClosePeerFailed)
				a.health.forget(name)
				a.links.forget(name)
			}
			lives[name] = inc
		}
	}
}

// logMember logs a change of membership: a join, a leave and a recovery at
// info, a failure at warn (an operator's alert), metadata updates at debug.
// failed holds when each member seen failing failed, so that its return
// is told as a recovery, with how long it was gone.
func (a *Agent) logMember(ev membership.MemberEvent, failed map[string]time.Time, now time.Time) {
	m := ev.Member
	attrs := []any{"peer", m.Name, "addr", m.Addr.String(), "peer_addr", m.Meta.PeerAddr}
	switch ev.Kind {
	case membership.MemberJoin:
		if at, ok := failed[m.Name]; ok {
			delete(failed, m.Name)
			a.eventLog.Info("member recovered", append(attrs, "down_for", now.Sub(at).Round(time.Millisecond))...)
			return
		}
		a.eventLog.Info("member joined", attrs...)
	case membership.MemberLeave:
		delete(failed, m.Name)
		a.eventLog.Info("member left", attrs...)
	case membership.MemberFail:
		failed[m.Name] = now
		a.eventLog.Warn("member failed: its blocks leave the index and its leases here end", attrs...)
	default:
		a.eventLog.Debug("member updated", attrs...)
	}
}

// goneReason is why the handle of a member that left or failed is
// closed: a member that left closes its endpoint after it leaves, so a
// read from it cut short is no RDMA failure; one that failed was cut off
// mid-read, and its readers count the reads that failed.
func goneReason(kind membership.MemberEventKind) transfer.CloseReason {
	if kind == membership.MemberLeave {
		return transfer.ClosePeerLeft
	}
	return transfer.ClosePeerFailed
}
