// Package fence holds the resource-side half of fencing: checks that make
// a protected resource reject writes from a holder whose lease has been
// superseded. A lease-based lock cannot stop a paused holder from writing
// after its lease expired; the resource can, by comparing the writer's
// fence (dlock.Lease.Fence) with the highest fence it has accepted.
//
// The rule Guard and Redis apply: a write with fence f by owner o is
// accepted when it is the resource's first (whatever f, 0 included), or f
// is greater than the highest fence seen for that resource, or equal to it
// and o is the owner who wrote with it (the same lease writing again).
// Anything else is rejected with ErrStale and changes nothing.
// SQLPredicate is stricter: it accepts only a fence above the row's (or a
// row without one), and a rejection shows as 0 rows affected.
//
//   - Guard: in-process, for resources a single process owns. Do runs the
//     write holding its resource only: writes to one resource are
//     serialised, writes to different resources are not.
//   - Redis: atomic check-and-set (Set) and check-and-read (Claim) scripts
//     for values kept in Redis; a read-modify-write claims on read. A key
//     holding anything but a value of the store (another type, a hash
//     with other fields) is refused with an error matching
//     dlock.ErrWrongType and left as it is.
//   - SQLPredicate: a WHERE clause fragment for SQL rows with a fence column.
//
// # Epochs
//
// Fences are comparable only within one lock backend and one key: every
// backend numbers its grants its own way (Redis server time in
// microseconds, an etcd revision, a ZooKeeper zxid, a memory counter), so a
// fence from one says nothing about a fence from another, and a fresh etcd
// cluster starts its revisions low again. A resource whose writers move to
// another backend, key or cluster must therefore start a new epoch: a
// number, above every epoch the resource has seen, that the writers send
// with their fences. A Token is such an (epoch, fence) pair; tokens compare
// by epoch first, then by fence, so the first write of the new epoch
// supersedes every fence of the old one, whatever its size, and a writer
// still holding a lease of the old backend is rejected from then on.
//
// Every check has a Token form (Guard.CheckToken, Redis.SetToken,
// Redis.ClaimToken, SQLTokenPredicate) applying the same rule to tokens;
// the plain forms of Guard and Redis use epoch 0, so a resource can move to
// epochs at its first switch without rewriting what it stored. Where the
// epoch comes from is the application's choice: a constant in its
// configuration raised with each migration, or the switch-over time in
// seconds; the one rule is that an epoch number is never used with two
// backends or keys. Writers of the old epoch still running during the
// switch are safe: until the first write or claim of the new epoch is
// accepted they act as the earlier holders they are, and from then on they
// are rejected.
//
// SQLPredicate is the exception: it reads the fence column only, so it
// cannot see a row's epoch. Against a row written in epoch 1 it accepts an
// epoch-0 writer whose raw fence is above the row's (an old backend's
// fences may be far larger than a new one's), overwriting the newer write;
// and as that writer leaves the row's epoch at 1 with its own large fence,
// every writer of epoch 1 with a smaller fence is rejected from then on.
// A SQL resource therefore moves to epochs in two steps. First every
// writer switches to SQLTokenPredicate, the epoch-0 ones passing the
// constant "0" as the epoch, as in SQLTokenPredicate("epoch", "fence",
// "0", "$1"), with the epoch column added and NULL meaning 0; on rows
// without an epoch that accepts exactly what SQLPredicate accepts. Only
// then does any writer use epoch 1.
package fence
