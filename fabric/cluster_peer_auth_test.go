package fabric_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvfabric/kvfabric/fabric"
	"github.com/kvfabric/kvfabric/fabric/fabricpb"
	"github.com/kvfabric/kvfabric/internal/wait"
)

// A node whose certificate comes from another CA joins gossip but
// authenticates to no peer: its /healthz is 503 naming the failure, its
// status shows every member reachable but not authenticated with the
// error, and its metrics count the failures. The others stay ready and
// show it as not authenticated.
func TestPeerFromAnotherCA(t *testing.T) {
	other, err := os.MkdirTemp("", "kvfca")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(other) })
	agents := clusterWith(t, 3, func(i int, c *fabric.Config) {
		c.MetricsAddr = fmt.Sprintf("127.0.0.%d:0", i+1)
		if i == 2 {
			c.DevCADir = filepath.Join(other, "ca")
		}
	})
	n1, n3 := agents[0], agents[2]
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	link := func(a *fabric.Agent, node string) (*fabricpb.Member, error) {
		st, err := dial(t, a).Status(ctx)
		if err != nil {
			return nil, err
		}
		for _, m := range st.Members {
			if m.Node == node && m.State == "alive" {
				return m, nil
			}
		}
		return nil, fmt.Errorf("%s not a member", node)
	}
	wait.For(t, 30*time.Second, "n3 not ready, naming the authentication failure", func() error {
		code, body := httpStatus(t, "http://"+n3.MetricsAddr()+"/healthz")
		if code != http.StatusServiceUnavailable || !strings.Contains(body, "cannot authenticate") {
			return fmt.Errorf("%d %q", code, body)
		}
		return nil
	})
	// One failed peer makes n3 not ready; each member's link is known once
	// n3 has dialed it.
	wait.For(t, 30*time.Second, "n3's links to n1 and n2 known: reachable, not authenticated, with the error", func() error {
		for _, peer := range []string{"n1", "n2"} {
			m, err := link(n3, peer)
			if err != nil {
				return err
			}
			if m.PeerAuthenticated || !m.PeerReachable || m.PeerError == "" {
				return fmt.Errorf("n3's link to %s: reachable %v authenticated %v error %q",
					peer, m.PeerReachable, m.PeerAuthenticated, m.PeerError)
			}
		}
		return nil
	})
	if m := n3.Metrics(); m.PeerAuthFailures == 0 || m.Ready || m.PeersAuthenticated != 0 || m.PeersUnauthenticated != 2 {
		t.Errorf("n3 metrics: %d auth failures, ready %v, %d authenticated, %d not", m.PeerAuthFailures, m.Ready, m.PeersAuthenticated, m.PeersUnauthenticated)
	}
	// n1 authenticates to n2 and is ready; it sees n3 as not authenticated.
	wait.For(t, 30*time.Second, "n1 ready and its links known", func() error {
		if code, body := httpStatus(t, "http://"+n1.MetricsAddr()+"/healthz"); code != http.StatusOK {
			return fmt.Errorf("n1 /healthz %d %q", code, body)
		}
		m2, err := link(n1, "n2")
		if err != nil {
			return err
		}
		m3, err := link(n1, "n3")
		if err != nil {
			return err
		}
		if !m2.PeerAuthenticated || m3.PeerAuthenticated || m3.PeerError == "" {
			return errors.New("links: n2 " + fmt.Sprint(m2.PeerAuthenticated) + ", n3 " + fmt.Sprint(m3.PeerAuthenticated, " ", m3.PeerError))
		}
		return nil
	})
	if m := n1.Metrics(); !m.Ready || m.PeerAuthFailures == 0 {
		t.Errorf("n1 metrics: ready %v, %d auth failures", m.Ready, m.PeerAuthFailures)
	}
}
