package fabric

import (
	"sync"
	"time"
)

// links keeps what this node's imports measured of each holder: the round
// trip of a control call and the throughput of reads, per transport, so
// that Lookup can say how long bringing blocks here would take before an
// engine pays for it. Safe for concurrent use; the zero value is ready.
type links struct {
	mu    sync.Mutex
	peers map[string]*link
}

// link is one holder's measurements, smoothed: each new sample weighs
// linkWeight.
type link struct {
	transport string
	rtt       time.Duration
	bytesPerS float64
	samples   uint64
}

// linkWeight is the weight of a new sample in the moving averages: recent
// enough to follow a link that changed, steady enough that one slow chunk
// (a lease that waited for room) does not swing the estimate.
const linkWeight = 0.25

// minLinkBytes is the smallest read that counts toward throughput: below
// it a read's time is mostly its round trip.
const minLinkBytes = 64 << 10

// observe records a chunk read from peer over transport: bytes in read,
// and rtt, the time of one control call to it.
func (l *links) observe(peer, transport string, rtt time.Duration, bytes uint64, read time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.peers == nil {
		l.peers = map[string]*link{}
	}
	k := l.peers[peer]
	if k == nil || k.transport != transport {
		// A new link, or one that changed transport: its old figures say
		// nothing about the new one.
		k = &link{transport: transport}
		l.peers[peer] = k
	}
	if k.samples == 0 {
		k.rtt = rtt
	} else {
		k.rtt = time.Duration((1-linkWeight)*float64(k.rtt) + linkWeight*float64(rtt))
	}
	if bytes >= minLinkBytes && read > 0 {
		// The read's own round trip is not throughput.
		tput := float64(bytes) / max(read-rtt, read/2).Seconds()
		if k.bytesPerS == 0 {
			k.bytesPerS = tput
		} else {
			k.bytesPerS = (1-linkWeight)*k.bytesPerS + linkWeight*tput
		}
	}
	k.samples++
}

// forget drops what was measured of peer (it left the cluster).
func (l *links) forget(peer string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.peers, peer)
}

// Estimate bases: how a fetch estimate was made.
const (
	estimateMeasured = "measured" // from this holder's own recent imports
	estimateCluster  = "cluster"  // no import from it yet: the mean of the holders measured
	estimateNone     = "none"     // nothing measured yet, or the size is unknown
)

// estimate is how long bringing bytes from peer would take: a lease and a
// release round trip, and the bytes at the measured throughput. With no
// measurement of peer it uses the mean of the peers measured; with none
// at all it answers zero and estimateNone.
func (l *links) estimate(peer string, bytes uint64) (time.Duration, string, string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if k := l.peers[peer]; k != nil && k.bytesPerS > 0 {
		return k.cost(bytes), estimateMeasured, k.transport
	}
	var mean link
	n := 0
	for _, k := range l.peers {
		if k.bytesPerS > 0 {
			mean.rtt += k.rtt
			mean.bytesPerS += k.bytesPerS
			n++
		}
	}
	if n == 0 {
		return 0, estimateNone, ""
	}
	mean.rtt /= time.Duration(n)
	mean.bytesPerS /= float64(n)
	return mean.cost(bytes), estimateCluster, ""
}

func (k *link) cost(bytes uint64) time.Duration {
	return 2*k.rtt + time.Duration(float64(bytes)/k.bytesPerS*float64(time.Second))
}
