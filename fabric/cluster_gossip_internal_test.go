package fabric

import (
	"testing"

	"github.com/kvfabric/kvfabric/membership"
	"github.com/kvfabric/kvfabric/transfer"
)

// A member that left gracefully closes its peer handle as left, so its
// readers do not count the reads its departure cut short as RDMA
// failures; a member that failed closes it as failed, so they do.
func TestGoneReason(t *testing.T) {
	for kind, want := range map[membership.MemberEventKind]transfer.CloseReason{
		membership.MemberLeave: transfer.ClosePeerLeft,
		membership.MemberFail:  transfer.ClosePeerFailed,
	} {
		if got := goneReason(kind); got != want {
			t.Errorf("a member's %v closes its handle as %v, want %v", kind, got, want)
		}
	}
}
