package fabric_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvfabric/kvfabric/fabric"
	"github.com/kvfabric/kvfabric/fabric/client"
	"github.com/kvfabric/kvfabric/fabric/fabricpb"
	"github.com/kvfabric/kvfabric/internal/wait"
	"github.com/kvfabric/kvfabric/layout"
	"github.com/kvfabric/kvfabric/membership"
)

// The node certificate's and the CA's expiry are exported, so that an
// alert can fire before peers start refusing the node.
func TestCertificateExpiryExported(t *testing.T) {
	a := startAgent(t, testConfig(t, "n1"))
	certs := a.Metrics().Certificates
	now := time.Now()
	want := 7 * 24 * time.Hour // the development CA and certificate live 7 days
	if len(certs) != 2 || certs[0].Name != "node" || certs[1].Name != "ca" {
		t.Fatalf("certificates %+v, want node and ca", certs)
	}
	for _, c := range certs {
		if at := c.NotAfter; at.Before(now.Add(want-time.Hour)) || at.After(now.Add(want+time.Minute)) {
			t.Errorf("%s certificate expires at %v, want about %v from now", c.Name, at, want)
		}
	}
}

func httpStatus(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// freeTCP returns an address on 127.0.0.1 that nothing listens on.
// The port is below the kernel's ephemeral range, which every bind to port
// 0 and every outgoing connection draws from: a port taken there and let go
// could be handed to another test's agent before this test's seed binds it
// ("address already in use"). It is free for TCP and UDP both, as
// memberlist binds it twice.
func freeTCP(t *testing.T) string {
	t.Helper()
	low := 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if n, err := strconv.Atoi(f[0]); err == nil {
				low = n
			}
		}
	}
	if low <= 10000 {
		t.Fatalf("the ephemeral port range starts at %d: no room below it for a seed's port", low)
	}
	for range 100 {
		port := 10000 + rand.IntN(low-10000)
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		l, err := net.Listen("tcp", addr)
		if err != nil {
			continue
		}
		u, err := net.ListenPacket("udp", addr)
		l.Close()
		if err != nil {
			continue
		}
		u.Close()
		return addr
	}
	t.Fatal("no free port below the ephemeral range in 100 tries")
	return ""
}

// An agent given a seed that does not answer starts (it retries), but
// /healthz says it has not joined and /metrics counts the failures, until
// the seed comes up.
func TestHealthzNotJoined(t *testing.T) {
	seed := freeTCP(t)
	cfg := testConfig(t, "n2")
	cfg.Join = []string{seed}
	a := startAgent(t, cfg)
	url := "http://" + a.MetricsAddr()
	code, body := httpStatus(t, url+"/healthz")
	if code != http.StatusServiceUnavailable || !strings.HasPrefix(body, "not joined n2") || !strings.Contains(body, seed) {
		t.Fatalf("/healthz with an unreachable seed: %d %q; want 503 \"not joined\" naming the seed", code, body)
	}
	t.Logf("/healthz: %d %s", code, strings.TrimSpace(body))
	wait.For(t, 10*time.Second, "two join failures counted", func() error {
		m := a.Metrics()
		if v := m.Membership.JoinFailuresBy[membership.JoinUnreachable]; v < 2 {
			return fmt.Errorf("%v unreachable failures", v)
		}
		if v := m.Membership.JoinAttempts; v < 2 {
			return fmt.Errorf("%v attempts", v)
		}
		if m.Joined {
			return fmt.Errorf("joined")
		}
		return nil
	})

	// The seed comes up: the agent joins, and is healthy.
	scfg := testConfig(t, "n1")
	scfg.GossipAddr = seed
	scfg.DevCADir = cfg.DevCADir // one cluster, one CA: ready needs a peer authenticated
	startAgent(t, scfg)
	wait.For(t, 15*time.Second, "healthy once the seed is up", func() error {
		if code, body := httpStatus(t, url+"/healthz"); code != http.StatusOK || !strings.HasPrefix(body, "ok n2") {
			return fmt.Errorf("%d %q", code, body)
		}
		return nil
	})
	if !a.Metrics().Joined {
		t.Error("metrics say not joined after joining")
	}
}

// With AllowAlone, an agent that has not joined is healthy, and says it
// is alone.
func TestHealthzAllowAlone(t *testing.T) {
	cfg := testConfig(t, "n2")
	cfg.Join = []string{freeTCP(t)}
	cfg.AllowAlone = true
	a := startAgent(t, cfg)
	code, body := httpStatus(t, "http://"+a.MetricsAddr()+"/healthz")
	if code != http.StatusOK || !strings.Contains(body, "alone") {
		t.Fatalf("/healthz with allow_alone: %d %q", code, body)
	}
	// Without seeds a node starts a cluster: healthy at once.
	b := startAgent(t, testConfig(t, "n3"))
	if code, body := httpStatus(t, "http://"+b.MetricsAddr()+"/healthz"); code != http.StatusOK || !strings.HasPrefix(body, "ok n3") {
		t.Fatalf("/healthz without seeds: %d %q", code, body)
	}
}

// The TLS files go together: one of them alone is refused by name, not
// with the error of opening an empty path.
func TestPartialTLSFilesRefused(t *testing.T) {
	cfg := testConfig(t, "n1")
	cfg.CAFile = filepath.Join(cfg.DataDir, "ca.crt")
	_, err := fabric.Start(context.Background(), cfg)
	var se *fabric.SettingError
	if !errors.As(err, &se) || se.Key != "cert_file" || !strings.HasPrefix(se.Why, "missing") {
		t.Fatalf("Start with only a CA file: %v; want a SettingError saying cert_file is missing", err)
	}
}

// A gossip key file that does not read is refused at start as a
// SettingError about gossip_key_file that matches ErrConfig and the error
// of opening it.
func TestMissingGossipKeyFileRefused(t *testing.T) {
	cfg := testConfig(t, "n1")
	cfg.GossipKeyFile = filepath.Join(cfg.DataDir, "missing.key")
	a, err := fabric.Start(context.Background(), cfg)
	if err == nil {
		a.Close()
		t.Fatal("started without its gossip key file")
	}
	var se *fabric.SettingError
	if !errors.As(err, &se) || se.Key != "gossip_key_file" || !errors.Is(err, fabric.ErrConfig) || !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("Start without the gossip key file: %v; want a SettingError about gossip_key_file matching ErrConfig and fs.ErrNotExist", err)
	}
}

// lockedBuffer is a bytes.Buffer safe for a logger and a reader at once.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// An agent logs at info when another node joins and when it leaves, and
// its status lists the node that left.
func TestAgentLogsMembersJoiningAndLeaving(t *testing.T) {
	var logs lockedBuffer
	agents := clusterWith(t, 2, func(i int, c *fabric.Config) {
		if i == 0 {
			c.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
		}
	})
	// A line with msg and the peer (the agent's node attribute between).
	has := func(msg string) func() error {
		return func() error {
			for _, line := range strings.Split(logs.String(), "\n") {
				if strings.Contains(line, `msg="`+msg+`"`) && strings.Contains(line, " peer=n2 ") {
					return nil
				}
			}
			return fmt.Errorf("not logged yet")
		}
	}
	wait.For(t, 10*time.Second, "n1 logs that n2 joined", has("member joined"))
	if err := agents[1].Close(); err != nil {
		t.Fatal(err)
	}
	wait.For(t, 10*time.Second, "n1 logs that n2 left", has("member left"))
	// Status still lists n2, as gone and since when.
	s, err := dial(t, agents[0]).Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var gone *fabricpb.Member
	for _, m := range s.Members {
		if m.Node == "n2" {
			gone = m
		}
	}
	if gone == nil || gone.State != "left" || time.Since(time.UnixMilli(gone.SinceUnixMs)) > time.Minute {
		t.Fatalf("status lists n2 as %+v, want left within the last minute", gone)
	}
}

// A gossip key rotated node by node with reloads (add the new key
// everywhere, make it primary, drop the old) never cuts the nodes off each
// other: blocks stored on one reach the other's index after each step.
func TestGossipKeyRotationByReload(t *testing.T) {
	dir := t.TempDir()
	k1 := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{1}, 32))
	k2 := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{2}, 32))
	file := func(i int) string { return filepath.Join(dir, fmt.Sprintf("gossip-%d.key", i)) }
	write := func(i int, keys ...string) {
		t.Helper()
		if err := os.WriteFile(file(i), []byte(strings.Join(keys, "\n")+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(0, k1)
	write(1, k1)
	agents := clusterWith(t, 2, func(i int, c *fabric.Config) { c.GossipKeyFile = file(i) })
	reload := func(i int, keys ...string) {
		t.Helper()
		write(i, keys...)
		if err := agents[i].Reload(); err != nil {
			t.Fatalf("reload of n%d: %v", i+1, err)
		}
	}
	e := client.Engine{Name: "producer", Model: testModel, TPSize: 1, PageSize: 16, Order: layout.HND, Slots: 64}
	reload(0, k1, k2)
	reload(1, k1, k2)
	reload(0, k2, k1) // n1 now encrypts with k2, which n2 has
	produceBlocks(t, agents[0], agents[1], e, 4)
	reload(1, k2, k1)
	reload(0, k2)
	reload(1, k2) // k1 is gone everywhere
	e.Name = "producer-2"
	produceBlocks(t, agents[1], agents[0], e, 4)
}
