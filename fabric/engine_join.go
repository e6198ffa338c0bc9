package fabric

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvfabric/kvfabric/layout"
	"github.com/kvfabric/kvfabric/pool"
)

// Joining a block set by its credential. A set is shared only within the
// process it was handed to (engine_memory.go), but one engine may be
// several processes: vLLM's scheduler and each TP worker of its
// multiprocess executor register the same layout and must use the same
// set. Each set gets a join token when it is made, carried only by
// Register's answers for it (RegisterResponse.join_token); the engine
// passes it over its own channel (its plans) to its other processes, whose
// Register names the set and the token (RegisterRequest.join_block_set,
// join_token) and is handed that set whatever other receivers live.
//
// The token is the set's own, not a memory token or IPC handle: a host
// pool pinned through the CUDA driver, and a device pool, hand every set
// the pool's one token or handle, which an engine of another set knows.
// A set that passes to another engine once every process it was handed to
// has exited (engineSet.mayJoin: the orphan cache's adoptions among them)
// gets a new token, so that the old one joins the new engine's set no more.

// newJoinToken is a new set's credential: 128 random bits.
func newJoinToken() string {
	var b [16]byte
	rand.Read(b[:])
	return "join-" + hex.EncodeToString(b[:])
}

// joinSet hands block set id to sess and process pid, given the set's join
// token: tmpl (Register's, Slots 0 where none was asked) and place must
// be the set's, as reusableSet requires of a set it reuses. Nothing new is
// made, so nothing is charged.
func (a *Agent) joinSet(sess *session, engine string, id uint64, token string, tmpl *layout.Layout, place []int, pid int32) (*sessionSet, error) {
	a.registerMu.Lock()
	defer a.registerMu.Unlock()
	a.mu.Lock()
	defer a.mu.Unlock()
	es, ok := a.sets[pool.SetID(id)]
	if !ok || setFreed(es) || es.staging {
		return nil, status.Errorf(codes.NotFound, "join_block_set: block set %d is not registered on this agent (freed, or of another run of it); register again", id)
	}
	es.mu.Lock()
	want := es.joinToken
	es.mu.Unlock()
	if subtle.ConstantTimeCompare([]byte(token), []byte(want)) != 1 {
		return nil, status.Errorf(codes.PermissionDenied, "join_token: not block set %d's; a set is joined with the token its Register answered", id)
	}
	if err := a.sameLayout(es, tmpl, tmpl.Slots, place); err != nil {
		return nil, err
	}
	if engine != "" && sess.id != 0 {
		sess.mu.Lock()
		sess.engine = engine
		sess.mu.Unlock()
	}
	// Whatever other receivers live: the token is the credential, so no
	// check of them (handOver's attachJoining) is made.
	ss, err := a.attach(sess, es)
	if err != nil {
		return nil, err
	}
	a.handedTo(es, pid)
	a.stats.setJoins.Add(1)
	a.log.Info("block set joined", "engine", engine, "set", id, "pid", pid)
	return ss, nil
}

// sameLayout says, INVALID_ARGUMENT naming the field, where tmpl (with
// asked slots, 0 for any count) and place differ from es's layout and
// placement: the test reusableSet makes of a set it reuses (layoutDiff).
func (a *Agent) sameLayout(es *engineSet, tmpl *layout.Layout, asked int, place []int) error {
	field, got, want := a.layoutDiff(es, tmpl, asked, place)
	if field == "" {
		return nil
	}
	return status.Errorf(codes.InvalidArgument, "%s: %s, block set %d has %s; a set is joined with its own layout", field, got, es.set.ID(), want)
}

// layoutDiff names the first of tmpl's fields (asked: its slots, 0 for any
// count) and place that differ from es's layout and placement, as the
// request names them, with the request's value and the set's; field is ""
// where none does: es is a set of the layout.
func (a *Agent) layoutDiff(es *engineSet, tmpl *layout.Layout, asked int, place []int) (field, got, want string) {
	l := es.set.Layout()
	switch {
	case l.Model != tmpl.Model:
		return "model", fmt.Sprintf("%+v", tmpl.Model), fmt.Sprintf("%+v", l.Model)
	case l.TPSize != tmpl.TPSize:
		return "tp_size", fmt.Sprint(tmpl.TPSize), fmt.Sprint(l.TPSize)
	case l.PageSize != tmpl.PageSize:
		return "page_size", fmt.Sprint(tmpl.PageSize), fmt.Sprint(l.PageSize)
	case l.Order != tmpl.Order:
		return "kv_order", fmt.Sprint(tmpl.Order), fmt.Sprint(l.Order)
	case l.Arrangement != tmpl.Arrangement:
		return "arrangement", fmt.Sprint(tmpl.Arrangement), fmt.Sprint(l.Arrangement)
	case l.Alignment != tmpl.Alignment:
		return "alignment", fmt.Sprint(tmpl.Alignment), fmt.Sprint(l.Alignment)
	case asked != 0 && l.Slots != asked:
		return "slots", fmt.Sprint(asked), fmt.Sprint(l.Slots)
	case !a.placedAs(es.set, place):
		return "devices", "another placement", "the set's"
	}
	return "", "", ""
}
