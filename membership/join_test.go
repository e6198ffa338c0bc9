package membership

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

// lockedBuffer collects a text log from several goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// lines returns the log lines that contain every one of subs.
func (l *lockedBuffer) lines(subs ...string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
next:
	for _, line := range strings.Split(l.b.String(), "\n") {
		for _, s := range subs {
			if !strings.Contains(line, s) {
				continue next
			}
		}
		out = append(out, line)
	}
	return out
}

// freeAddr returns a loopback TCP address where nothing listens.
func freeAddr(t *testing.T, ip string) string {
	l, err := net.Listen("tcp", ip+":0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// A node that cannot join its seed says so at WARN with the reason, counts
// each try, retries with a backoff, and reports that it has not joined;
// the same node joins once the seed is right.
func TestJoinFailuresAreLoud(t *testing.T) {
	key := []byte("0123456789abcdef")
	c := newCluster(t, 1, func(cfg *Config) {
		cfg.Keys = [][]byte{key}
		cfg.ClusterName = "prod"
	})
	seed := c.seeds[0]
	if ok, err := c.nodes[0].m.Joined(); !ok || err != nil {
		t.Fatalf("a node without seeds: Joined = %v, %v; it starts the cluster", ok, err)
	}
	for i, tc := range []struct {
		name   string
		seed   string
		key    []byte
		label  string
		reason JoinReason
		says   string
	}{
		{"unreachable seed", freeAddr(t, "127.0.0.60"), key, "prod", JoinUnreachable, "unreachable"},
		{"wrong gossip key", seed, []byte("fedcba9876543210"), "prod", JoinWrongKey, "gossip key"},
		{"no gossip key", seed, nil, "prod", JoinWrongKey, "gossip key"},
		{"wrong cluster name", seed, key, "staging", JoinNoAnswer, "cluster name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logs := &lockedBuffer{}
			cfg := testConfig(fmt.Sprintf("joiner-%d", i), 61+i)
			cfg.Seeds = []string{tc.seed}
			cfg.ClusterName = tc.label
			if tc.key != nil {
				cfg.Keys = [][]byte{tc.key}
			}
			cfg.RejoinInterval = 400 * time.Millisecond
			cfg.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			start := time.Now()
			m, err := Start(ctx, cfg)
			if err != nil {
				t.Fatalf("Start: %v (a failed join is retried, not returned)", err)
			}
			defer m.shutdown(false)
			waitFor(t, 20*time.Second, "three failed joins", func() bool { return m.Metrics().JoinFailuresBy[tc.reason] >= 3 })
			elapsed := time.Since(start)
			mt := m.Metrics()
			if mt.Joined || mt.Members != 1 {
				t.Errorf("metrics say joined %v with %d members", mt.Joined, mt.Members)
			}
			if mt.JoinFailures != mt.JoinFailuresBy[tc.reason] || mt.JoinAttempts < mt.JoinFailures {
				t.Errorf("failures %d, of which %d for %v; attempts %d: %+v", mt.JoinFailures, mt.JoinFailuresBy[tc.reason], tc.reason, mt.JoinAttempts, mt.JoinFailuresBy)
			}
			// Backoff: the first retries come sooner than RejoinInterval,
			// later ones no sooner than about RejoinInterval; never a
			// tight loop.
			if perTry := elapsed / time.Duration(mt.JoinAttempts); perTry < 30*time.Millisecond {
				t.Errorf("%d attempts in %v: retrying in a tight loop", mt.JoinAttempts, elapsed)
			}
			joined, lastErr := m.Joined()
			var je *JoinError
			if joined || !errors.As(lastErr, &je) || je.Reason != tc.reason || je.Seed != tc.seed {
				t.Fatalf("Joined = %v, %v; want false with a JoinError for %s, reason %v", joined, lastErr, tc.seed, tc.reason)
			}
			if !strings.Contains(lastErr.Error(), tc.says) || !strings.Contains(lastErr.Error(), tc.seed) {
				t.Errorf("error %q does not name the seed and say %q", lastErr, tc.says)
			}
			warns := logs.lines("level=WARN", "seed="+tc.seed, "reason="+tc.reason.String())
			if len(warns) < 3 {
				t.Errorf("%d warnings naming the seed and the reason for %d failures:\n%s", len(warns), mt.JoinFailures, strings.Join(logs.lines(""), "\n"))
			} else {
				t.Logf("%d attempts in %v; %s", mt.JoinAttempts, elapsed.Round(time.Millisecond), warns[0])
			}
		})
	}
	// Right key and name: joined, and it says so.
	logs := &lockedBuffer{}
	cfg := testConfig("joiner-ok", 70)
	cfg.Seeds, cfg.Keys, cfg.ClusterName = []string{seed}, [][]byte{key}, "prod"
	cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	m, err := Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer m.shutdown(false)
	if ok, err := m.Joined(); !ok || err != nil {
		t.Fatalf("Joined = %v, %v after a good join", ok, err)
	}
	if n := len(logs.lines("level=WARN")); n != 0 {
		t.Errorf("%d warnings for a good join", n)
	}
}

// A node whose seed starts later becomes joined when the seed comes up.
func TestJoinedWhenSeedComesUp(t *testing.T) {
	seedAddr := freeAddr(t, "127.0.0.71")
	cfg := testConfig("early", 72)
	cfg.Seeds = []string{seedAddr}
	cfg.RejoinInterval = 200 * time.Millisecond
	cfg.Logger = slog.New(slog.NewTextHandler(&lockedBuffer{}, nil))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	early, err := Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer early.shutdown(false)
	if ok, err := early.Joined(); ok || err == nil {
		t.Fatalf("Joined = %v, %v with the seed down; want false and the join error", ok, err)
	}
	host, port, _ := net.SplitHostPort(seedAddr)
	scfg := testConfig("seed", 71)
	scfg.BindAddr = host
	fmt.Sscan(port, &scfg.BindPort)
	scfg.Logger = cfg.Logger
	s, err := Start(ctx, scfg)
	if err != nil {
		t.Fatal(err)
	}
	defer s.shutdown(false)
	waitFor(t, 10*time.Second, "the early node joined", func() bool { ok, _ := early.Joined(); return ok })
	// The failures before the seed came up are history: no stale error.
	// (Joined turns true inside the join, a moment before it returns.)
	waitFor(t, 10*time.Second, "Joined to drop the error of the failed joins", func() bool {
		ok, err := early.Joined()
		return ok && err == nil
	})
}

// Retries of a seed that never answers back off: an eighth of
// RejoinInterval first, doubling up to RejoinInterval, each jittered by
// ±20 %. The waits are checked as the join loop chose them (its debug log);
// the wall clock only for a loose upper bound, since a loaded machine
// stretches every gap.
func TestJoinBackoff(t *testing.T) {
	logs := &lockedBuffer{}
	cfg := testConfig("patient", 73)
	seed := freeAddr(t, "127.0.0.74")
	cfg.Seeds = []string{seed}
	cfg.RejoinInterval = 1600 * time.Millisecond
	cfg.Logger = slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	m, err := Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer m.shutdown(false)
	// Tries at about 0, 0.2, 0.6, 1.4, 3.0 and 4.6 s.
	waitFor(t, 30*time.Second, "six failed joins", func() bool { return m.Metrics().JoinFailures >= 6 })
	var at []time.Time
	for _, line := range logs.lines(`"level":"WARN"`, seed) {
		var rec struct{ Time time.Time }
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatal(err)
		}
		at = append(at, rec.Time)
	}
	if len(at) < 6 {
		t.Fatalf("%d warnings for 6 failures", len(at))
	}
	type round struct {
		AfterFailure  bool  `json:"after_failure"`
		Nominal, Wait int64 // nanoseconds
	}
	var rounds []round
	for _, line := range logs.lines(`"msg":"membership: next join round"`) {
		var r round
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatal(err)
		}
		rounds = append(rounds, r)
	}
	// Round i's wait comes before try i+1: five waits for six tries.
	if len(rounds) < 5 {
		t.Fatalf("%d join rounds logged for %d failures", len(rounds), len(at))
	}
	// 200, 400, 800 ms, then capped at RejoinInterval: uncapped, the
	// fifth would be 3.2 s.
	for i, want := range []time.Duration{200, 400, 800, 1600, 1600} {
		want *= time.Millisecond
		r := rounds[i]
		nominal, wait := time.Duration(r.Nominal), time.Duration(r.Wait)
		if !r.AfterFailure || nominal != want {
			t.Errorf("round %d: nominal wait %v after failure %v, want %v after a failure", i, nominal, r.AfterFailure, want)
		}
		if lo, hi := want*4/5, want*6/5; wait < lo || wait > hi {
			t.Errorf("round %d: waited %v, want %v ± 20 %% (%v..%v)", i, wait, want, lo, hi)
		}
		// The wall clock agrees: no sooner than the wait, and not many
		// times later (a join of a closed port fails at once).
		if gap := at[i+1].Sub(at[i]); gap < wait-10*time.Millisecond || gap > 5*want+time.Second {
			t.Errorf("gap %d between warnings is %v for a wait of %v", i, gap, wait)
		}
	}
	t.Logf("rounds: %+v", rounds[:5])
}
