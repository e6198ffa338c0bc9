// Package membership is kvfabric's gossip layer over hashicorp/memberlist:
// who is in the cluster, what each node says about itself, and the
// replication of block store and remove events to every node.
//
// # Membership
//
// [Start] creates a memberlist node with the cluster's keyring (AES-GCM)
// and label (the cluster name), joins the seeds and keeps rejoining those
// that are not members every RejoinInterval, so that a node started before
// its seeds, or one side of a healed partition, finds the others without an
// operator. While no seed answers, retries back off from an eighth of
// RejoinInterval, each failure is logged at WARN with its reason
// ([JoinReason]) and counted, and [Membership.Joined] reports false. Joins, updates, graceful leaves and failures arrive on
// [Membership.Events]. memberlist reports leaves and failures through one
// callback without saying which, so a leaving node first sends every member
// a best-effort "bye"; a departure without one is reported as a failure. Each node's [Meta] (peer and API addresses,
// transports, layout-set digest, load, event incarnation) is encoded in a
// few dozen bytes and checked against memberlist's 512-byte limit at start
// and in SetMeta, never at gossip time.
//
// memberlist logs per packet; its log goes through a writer that turns it
// into slog records and logs each distinct warning once per LogRepeatWindow,
// so a node knocking with the wrong key or label is reported once.
//
// # Event replication
//
// A node numbers its own store and remove events from 1 within its
// incarnation (its start time, so a restart starts a new stream) with
// [Membership.Publish]. Every FlushInterval the new events are encoded into
// batches that fit a gossip packet and queued in memberlist's broadcast
// queue; a node that receives a batch with news relays it once, so batches
// spread epidemically and not only to the few nodes the origin gossips to.
// A receiver applies each origin's events in order to its [Sink] (the
// global block index), buffering events that arrive past a gap.
//
// Gaps close by repair: memberlist's push/pull exchange carries each
// origin's latest number, so a node that missed the last batch of an origin
// that has gone quiet, or a late joiner, learns what it lacks. After
// RepairDelay the node asks the origin, through a [Repairer] (the peer
// transport), for the missing range, in as many calls as the Repairer's
// answers take (a gap of any length, page by page); if the origin no longer
// keeps it ([ErrRangeGone]) or refuses it for its size ([ErrRangeTooLarge]),
// for a [HoldingsSnapshot] of its holdings, which replaces what the node had. The
// origin serves a snapshot in pages ([Membership.SnapshotPage]), every page
// from one copy frozen at the first, so that holdings of millions of
// blocks travel in frames of bounded size and still describe one moment;
// nodes that ask together share a copy a few seconds old, catching up
// from its number by range, and past two copies in use a new one is
// refused as busy ([ErrSnapshotBusy]) rather than evicting one being read. A
// node declared dead or that left is dropped from the Sink; an origin seen
// with a new incarnation is dropped and rebuilt, never merged.
//
// What a node has published about itself is kept in step with its pool by
// the caller: when the pool dropped events before they were published,
// [Membership.Reconcile] publishes the stores and removes that make the
// published holdings equal the pool's registry.
//
// Only the run memberlist accepted for a name (the incarnation in its
// metadata) is applied, so another instance under the same name never
// replaces the live one's entries.
//
// # Name conflicts
//
// Two nodes under one name (cloned hosts keep the host name) would take
// each other's blocks in every index. memberlist keeps the first and calls
// the conflict delegate; the later run (by incarnation) refuses if the
// other answers a ping under the name (a silent one is most likely its own
// previous run, not yet reaped): [Start] fails with a [NameConflictError]
// naming the other's address, or, when the conflict shows only later, the
// node stops by itself without a leave ([Membership.Stopped],
// [Membership.Err]).
//
// # Wire
//
// Every message starts with a version byte (1) and a type byte; see
// [AppendBatch] for event batches, [Meta.MarshalBinary] for metadata, and
// appendState for push/pull state. Decoders validate everything: a peer's
// bytes never panic a node.
package membership
