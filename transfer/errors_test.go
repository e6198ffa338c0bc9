package transfer

import (
	"fmt"
	"testing"
)

// An error that wraps two sentinels always gets the same wire code, the
// more specific one.
func TestCodeOfTwoSentinels(t *testing.T) {
	err := fmt.Errorf("%w: %w", ErrLeaseRefused, ErrUnavailable)
	for range 200 {
		if c := codeOf(err); c != CodeLeaseRefused {
			t.Fatalf("codeOf(%v) = %d, want CodeLeaseRefused", err, c)
		}
	}
	if len(codeOrder) != len(codeSentinel) {
		t.Fatalf("codeOrder has %d codes, codeSentinel %d", len(codeOrder), len(codeSentinel))
	}
}
