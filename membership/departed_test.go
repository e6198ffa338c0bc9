package membership

import (
	"fmt"
	"testing"
	"time"
)

// Departed members are kept up to maxDeparted (one more evicts the
// oldest) and for departedKept (a moment past it, they go).
func TestDepartedLimits(t *testing.T) {
	m := &Membership{departed: map[string]DepartedMember{}}
	t0 := time.Unix(1000, 0)
	for i := range maxDeparted {
		m.noteDepartedLocked(Member{Name: fmt.Sprintf("n%d", i)}, MemberFail, t0.Add(time.Duration(i)*time.Millisecond))
	}
	if len(m.departed) != maxDeparted {
		t.Fatalf("%d departed kept at the limit, want %d", len(m.departed), maxDeparted)
	}
	m.noteDepartedLocked(Member{Name: "late"}, MemberLeave, t0.Add(time.Second+time.Duration(maxDeparted)*time.Millisecond))
	if _, ok := m.departed["n0"]; ok || len(m.departed) != maxDeparted {
		t.Fatalf("one past the limit: %d kept, oldest still there: %v", len(m.departed), ok)
	}
	if d := m.departed["late"]; d.Kind != MemberLeave {
		t.Fatalf("the newest departed: %+v", d)
	}
	last := m.departed["late"].Since
	m.pruneDepartedLocked(last.Add(departedKept))
	if _, ok := m.departed["late"]; !ok {
		t.Fatal("a member departed exactly departedKept ago was dropped")
	}
	m.pruneDepartedLocked(last.Add(departedKept + time.Nanosecond))
	if _, ok := m.departed["late"]; ok || len(m.departed) != 0 {
		t.Fatalf("past departedKept: %d still listed", len(m.departed))
	}
}
