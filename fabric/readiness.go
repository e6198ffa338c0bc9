package fabric

import "fmt"

// notReady says why a joined node is not ready to serve engines yet, ""
// when it is: until its first full repair after a (re)start its index
// lacks blocks the cluster holds, and lookups routed to it would miss them;
// while it has authenticated to none of its peers it can import nothing.
func (a *Agent) notReady() string {
	if reason := a.peersNotReady(); reason != "" {
		return reason
	}
	if ok, behind := a.members.Synced(); !ok {
		return fmt.Sprintf("syncing the index: %d origins not yet repaired since the start", behind)
	}
	return ""
}
