// Package disk is the bottom tier of a node's block cache: blocks kept in
// large preallocated files on local NVMe, written and read with O_DIRECT
// (the page cache would only hold a second copy of what the host tier
// already has), checked against a checksum on every read, and found again
// after a restart through a small journal.
//
// # Files
//
// A store is a directory:
//
//	blocks.NNN   data files, each FileBytes long, preallocated; a file is
//	             an array of slots of SlotBytes (a multiple of 4096)
//	journal      fixed-size records, appended; replayed at Open
//	journal.new  a compaction in progress (renamed over journal when done)
//
// A journal record (64 bytes, little endian):
//
//	offset  size  field
//	0       4     magic "KVFJ"
//	4       1     op: 1 put, 2 delete
//	5       1     flags: bit 0, a parent in bytes 48..55; bit 1, with
//	              op 1 and bit 0, a link record (below); op 1 with bit
//	              1 but not bit 0 is never written, and ignored (a
//	              version that ignores bit 1 reads it as a put); other
//	              bits ignored (zero in a journal written before parents)
//	6       2     reserved, zero
//	8       8     sequence number, increasing
//	16      8     block hash
//	24      8     tag (what the caller keeps beside the hash: a layout id)
//	32      4     slot
//	36      4     length of the block's bytes
//	40      8     xxh3 of the block's bytes
//	48      8     parent: the hash of the block this one follows in its
//	              sequence, under the same tag (Batch.SetParent); zero
//	              where flags say none
//	56      8     xxh3 of bytes 0..55
//
// A block's parent is the caller's (the tiers above learn from it which
// block follows which, to read ahead, after a restart too): kept with the
// block while it is held, in its put's record and in a compacted
// journal's, and returned by Parent. SetParent gives a block held another
// (or a first) parent: a link record, a put record that restates the block
// held (its slot, length and checksum) with flags bits 0 and 1 and the new
// parent, written with the next commit (a put's, or Close's),
// in its write and sync, and counted (Stats.Links); SetParent writes
// nothing itself, so a crash before that commit loses the parent it set. A
// replay applies a link record only whole (its checksum, as every
// record's) and only to the block it restates, the one held under its key
// then, and only with a parent; any other it ignores (counted in the log),
// replaying the records after it. A delete names its block by slot, length
// and checksum, not by its parent (its record's bytes 5 and 48..55 are
// zero). A journal written before parents were kept replays as it did, its
// blocks with none; one written with them is read by such a version, which
// ignores them (a link record it reads as a put of the block again), and
// drops the parent of each block it writes a record of again (its
// compaction, a put of the block anew).
//
// Keys lists the blocks in the order of the records that last named them
// (a put's, or a link record's), as the journal has them after Open; a
// compaction writes the live blocks' records in that order, so it keeps
// the order as well as the parents. The tiers above relink a restarted
// store's blocks in that order, so that where two blocks name one parent,
// the one named last wins.
//
// # Crash consistency
//
// A put writes the block's bytes to a free slot, then its record is
// committed: the data file synced, the record appended, the journal synced.
// Puts that wait for a commit share it (a group commit), so concurrent puts
// share their syncs; PutBatch writes many blocks and commits them at once,
// with one sync of each data file written and one journal write and sync
// for the lot. A Batch's caller that writes from memory which may change
// under the write (a block written straight from a pool slot an
// allocation may take) waits for the write (Wait), and if the memory did
// change writes the block again from other bytes (Replace, whose checksum
// is recorded instead) or takes it out (Drop): a record's checksum is
// always of the bytes its caller meant. A block is in the store exactly
// when its record is. An agent killed mid-put leaves bytes in a slot
// no record names (the slot is free again at Open) or a record cut short at
// the journal's end (its own checksum fails, it is ignored and truncated).
// A delete waits for no journal sync: its record is left for the next
// commit (a put's, or Close's), which writes it before its own records, so
// that it reaches the journal before, or with, the record of any put that
// reuses the slot; a crash before then finds the block whole, or, where a
// put wrote its slot and did not commit, refused by its checksum. It names
// the block it removed, and a replay drops the key only while it still
// names that block. A commit's blocks enter the store in its records'
// order before the journal may be compacted, so the compacted journal
// holds them.
// A journal write or sync that fails is cut back to where it began; where
// that fails too, every later commit fails. Every read checks
// the block's bytes against the checksum in its record: a block whose bytes
// were torn or changed on disk is dropped (logged, counted, deleted), never
// returned.
//
// # Generations
//
// Each copy a store holds has a generation, a number no other copy in the
// store was given: a commit gives one to each block it puts (a key put
// again gets a new one), and Open to each block it finds again. They are
// kept in memory only, not journaled: a generation names a copy while the
// store is open. They count from 1: 0 is no copy's. GetGen and
// GetPiecesGen return the generation of the copy read (also of one that
// failed a check), Gen that of the copy held (none once the store is
// closed, when Has reports none either), and DeleteIf deletes a key's
// copy only while it is that generation's: a caller that found a copy bad
// by checks of its own deletes that copy, never one committed since in its
// place. A read that fails the store's checksum drops the copy it read
// (its slot, held by the read, is not reused meanwhile).
//
// # Concurrency
//
// At most Workers (at most MaxWorkers) reads and writes run at once.
// Writes go through a pool of as many workers doing pwrite (pwritev for a
// block given in aligned pieces); at most QueueDepth requests wait for
// them, and a request past that waits for room under its context. Reads
// run pread (preadv into aligned pieces) on their callers' goroutines once
// one of the Workers turns is free, waiting for it under their context:
// a hand-off to a worker costs two goroutine wake-ups per read. io_uring
// was not used: the Go libraries for it are young or unmaintained, and at the
// queue depths a cache tier needs, a few blocking workers keep an NVMe busy.
//
// # Host memory
//
// MemStore is the tier above: the same keys, sentinels, generations and
// batch rules in slots of host memory, each block's xxh3 checked on every
// read, no journal; it does not outlive its process.
package disk
