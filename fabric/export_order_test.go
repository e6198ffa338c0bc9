package fabric

import "fmt"

// TierAnnouncing says whether a's tiers announce each change to their
// records on its own (announceAll ran once the node joined).
func TierAnnouncing(a *Agent) bool { return a.tiers.announcing.Load() }

// TierAnnouncementChecked, called as the tiers announce that a holds
// (store) or no longer holds hashes under block set number set (the
// tierAnnounced hook), says what is wrong with it: the tiers' ordering
// (announceMu) not held, or a hash whose record is not (store) or still is
// (!store) in the tier of set.
func TierAnnouncementChecked(a *Agent, store bool, set uint32, hashes []uint64) error {
	t := a.tiers
	if t.announceMu.TryLock() {
		t.announceMu.Unlock()
		return fmt.Errorf("announced (store %v, set %d) without the tiers' ordering held", store, set)
	}
	for _, h := range hashes {
		in := false
		if k, ok := t.find(h); ok {
			if d := t.where(k); d != nil && t.tierSet(d.n) == set {
				in = true
			}
		}
		if in != store {
			return fmt.Errorf("announced (store %v, set %d) %#x, recorded in that tier: %v", store, set, h, in)
		}
	}
	return nil
}
