package fabric

import (
	"bytes"
	"log/slog"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/kvfabric/kvfabric/membership"
)

// Every change of membership is logged: joins, leaves and recoveries at
// info, failures at warn, updates only at debug.
func TestMemberChangesLogged(t *testing.T) {
	var buf bytes.Buffer
	a := &Agent{eventLog: slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo}))}
	m := membership.Member{Name: "n2", Addr: netip.MustParseAddrPort("127.0.0.2:7946"), Meta: membership.Meta{PeerAddr: "127.0.0.2:7947"}}
	failed := map[string]time.Time{}
	t0 := time.Unix(1000, 0)
	steps := []struct {
		kind membership.MemberEventKind
		at   time.Duration
		want string // the line logged, or "" for none at info
	}{
		{membership.MemberJoin, 0, `level=INFO msg="member joined" peer=n2 addr=127.0.0.2:7946 peer_addr=127.0.0.2:7947`},
		{membership.MemberUpdate, time.Second, ""},
		{membership.MemberFail, 2 * time.Second, `level=WARN msg="member failed: its blocks leave the index and its leases here end" peer=n2`},
		{membership.MemberJoin, 9500 * time.Millisecond, `level=INFO msg="member recovered" peer=n2 addr=127.0.0.2:7946 peer_addr=127.0.0.2:7947 down_for=7.5s`},
		{membership.MemberJoin, 10 * time.Second, `level=INFO msg="member joined" peer=n2`},
		{membership.MemberLeave, 11 * time.Second, `level=INFO msg="member left" peer=n2`},
	}
	for i, s := range steps {
		buf.Reset()
		a.logMember(membership.MemberEvent{Kind: s.kind, Member: m}, failed, t0.Add(s.at))
		got := buf.String()
		if s.want == "" {
			if got != "" {
				t.Errorf("step %d (%v): logged %q at info, want nothing", i, s.kind, got)
			}
			continue
		}
		if !strings.Contains(got, s.want) {
			t.Errorf("step %d (%v): logged %q, want %q", i, s.kind, got, s.want)
		}
	}
	if len(failed) != 0 {
		t.Errorf("failed members left over: %v", failed)
	}
}
