package fabric

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
)

// Reload re-reads the node's TLS files (in development mode, re-issues its
// certificate from the development CA) and the gossip key file, checks them
// as at start, and puts them in use without leaving the cluster: peer
// connections made from now on present the new certificate and verify
// peers against the new CA, and gossip encrypts with the file's first key
// and still accepts the others. A part that fails its checks is refused,
// with the reason, and what was in use stays. kvfabric agent calls it on
// SIGHUP. Safe to call from any goroutine once Start has returned.
func (a *Agent) Reload() error {
	a.reloadMu.Lock()
	defer a.reloadMu.Unlock()
	var errs []error
	cert, cas, checked, err := a.tlsIdentity()
	if err == nil {
		err = a.transport.SetIdentity(cert, cas)
	}
	if err != nil {
		errs = append(errs, fmt.Errorf("TLS identity not reloaded, the one in use stays: %w", err))
	} else {
		a.useIdentity(checked)
	}
	if a.cfg.GossipKeyFile != "" {
		if err := a.reloadKeys(); err != nil {
			errs = append(errs, fmt.Errorf("gossip keys not reloaded, those in use stay: %w", err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		a.eventLog.Error("reload refused", "err", err)
		return err
	}
	a.eventLog.Info("reloaded the TLS identity and gossip keys", "gossip_key_file", a.cfg.GossipKeyFile)
	return nil
}

// reloadKeys makes the gossip keyring the key file's keys, the first the
// primary: new keys are installed before the primary changes, and keys no
// longer in the file go last, so that a rotation done node by node (add the
// new key everywhere, then make it first, then drop the old) never leaves
// two nodes without a common key.
func (a *Agent) reloadKeys() error {
	keys, err := readKeys(a.cfg.GossipKeyFile)
	if err != nil {
		return err
	}
	for _, k := range keys {
		if err := a.members.InstallKey(k); err != nil {
			return fmt.Errorf("install a key of %s: %w", a.cfg.GossipKeyFile, err)
		}
	}
	if err := a.members.UseKey(keys[0]); err != nil {
		return fmt.Errorf("make the first key of %s primary: %w", a.cfg.GossipKeyFile, err)
	}
	have, err := a.members.Keys()
	if err != nil {
		return err
	}
	for _, k := range have {
		if !slices.ContainsFunc(keys, func(x []byte) bool { return bytes.Equal(x, k) }) {
			if err := a.members.RemoveKey(k); err != nil {
				return fmt.Errorf("remove a key no longer in %s: %w", a.cfg.GossipKeyFile, err)
			}
		}
	}
	return nil
}
