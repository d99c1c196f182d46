// Package etcdlock is the etcd backend of dlock: fair (FIFO) locks,
// semaphores, read-write locks and leader election, with fencing tokens
// and a lost-lease signal, on an etcd v3 cluster, behind the same API as
// every dlock backend.
//
//	cli, _ := clientv3.New(clientv3.Config{Endpoints: []string{"127.0.0.1:2379"}})
//	locks := dlock.New(etcdlock.New(cli), dlock.WithTTL(10*time.Second))
//	lease, err := locks.Acquire(ctx, "order:1001")
//
// It is its own Go module so that users of the Redis backends never
// download gRPC. It needs an etcd 3.4 or newer server (tested with 3.4.23
// and the 3.5 client).
//
// # Keys
//
// A lock named key is a directory of etcd keys (entries), one per holder
// or waiter:
//
//	PREFIX + escape(key) + "/" + NAME
//
// with PREFIX DefaultPrefix ("/dlock/") unless WithPrefix says otherwise,
// and escape replacing "%" by "%25" and "/" by "%2F" (so the lock "a" and
// the lock "a/b" never share a directory). An entry's value is "COUNT
// TOKEN": the number of holds of a reentrant owner (1 otherwise) and the
// owner token; an elected leader's entry with a value is "COUNT/LEN
// TOKEN VALUE" (LEN the token's length, no separator between TOKEN and
// VALUE: see Leader election). The entry is created with a lease (see Leases) in a
// transaction that succeeds only if the key does not exist; its create
// revision orders the queue and is the fence.
//
// NAME is hex(sha256(token))[:32] for a reentrant owner (dlock.WithOwner),
// so every Backend finds the owner's entry. Other acquisitions carry a
// random token used once, and an entry named after it would leave a dead
// key in the directory with every acquisition: etcd keeps deleted keys in
// its index until the cluster is compacted, and every read of the queue
// walks them, so a busy lock slowed down with its history (20,000 past
// acquisitions made hand-offs 3× slower). Their entries are named after
// the Backend instead, ID + "." + SLOT: a random id per Backend and the
// smallest slot number it does not use for that lock at the moment, so a
// Backend taking the same lock again and again reuses one key (as
// concurrency.Mutex reuses its session's key). The Backend remembers the
// slot of each lock it queues for or holds: LockKey and Guard name the
// entry of such a lease only through the Backend that granted it (another
// Backend's Guard never succeeds for it).
//
// # Leases
//
// Entries live on etcd leases of two kinds.
//
// A non-reentrant entry (a random token used once) is on one of the
// Backend's shared leases: one per distinct TTL (in whole seconds, rounded
// up), shared by all such locks and queue entries of the Backend; with
// one TTL, as with a dlock.Client's WithTTL, that is one lease, granted
// once. Such an entry has exactly one hold, tracked by one Backend. Calls
// that need a shared lease while it is being granted wait for that grant
// and share its error, except when the grant failed because its caller's
// context ended (also when the server saw the deadline pass first): then
// each tries again with its own context.
//
// An owner's entry (dlock.WithOwner: a reentrant request) is on a private
// lease granted for that entry alone, so that only the renewals of its own
// holds keep it alive (see Reentrancy). Creating one costs one more round
// trip (a lease grant), unless the Backend has a spare private lease: one
// it granted for an attempt that attached nothing, or whose entry was
// released (at most one per TTL, used while valid for half its TTL).
//
// The Backend starts no keep-alive stream of its own: Refresh and
// RefreshMany send one KeepAliveOnce per lease, so the Client's watchdog
// (every TTL/3) drives renewal. Two exceptions renew a lease outside the
// watchdog: an acquisition sends a keep-alive concurrently with its
// transaction unless the lease was renewed since the call began (so the
// lock lives on the server at least TTL from the call, as the Client
// assumes) or at most TTL/10 before it, and a waiter in Wait renews its
// entry's lease every TTL/3 while it is queued (the Client renews only
// granted locks). A grant right after such a recent renewal counts the
// lock's lifetime from the renewal instead, saving the keep-alive (a
// Backend taking locks often sends one keep-alive per TTL/10 instead of
// one per acquisition): the lock's Expires is then at most TTL/10 earlier
// than asked. The two calls tell the Client differently, as the Client
// counts their grants differently: a grant at the end of Wait sets
// Grant.Since to the renewal, from which the Client counts a queue
// wait's lock; TryAcquire's grant sets Grant.TTL to what is left of the
// lease from the start of the call, since the Client counts a
// TryAcquire's lock from there whatever Grant.Since says (a lock counted
// from the call's start for the full TTL would outlive its lease on the
// server by up to TTL/10).
//
// Deadlines never move back. etcd renews a lease to the TTL it was
// granted with, and a lease's TTL cannot change, so an entry's deadline
// is its lease's last renewal plus the lease's TTL. Every operation that
// sets a lock's lifetime — a grant, a re-entry, Refresh, RefreshMany —
// leaves the entry on a lease granted for at least the TTL asked, renewed
// at or after the call began (or known valid until the call's start plus
// the TTL): when the entry's lease is shorter than the TTL asked, the
// entry moves to a longer one (compare-and-swap on its create and mod
// revisions: a put keeping the value, with the new lease): the shared
// lease of that TTL, or a new private lease for an owner's entry. The
// longer lease is renewed just before the move, so the entry's deadline
// moves forward even if the call ends right after the move. An entry
// never moves to a shorter lease: a Refresh or re-entry with a shorter TTL
// renews the longer lease the entry is on, so the lock lives at least as
// long as every hold's Expires. Since another Backend of the same owner
// may move an owner's entry, renewing one reads the entry first and
// renews the lease it is on (one read more per renewal of such a lock).
//
// The minimum TTL is MinTTL (2 s), which MinTTL also reports
// (dlock.TTLFloor). etcd counts lease TTLs in whole seconds and raises a
// TTL below its minimum, ceil(1.5 × election timeout) = ceil(1.5 × 1 s) =
// 2 s with the default election timeout, to that minimum; a shorter lock
// TTL would be kept on the server longer than asked. The renewal period at
// MinTTL, MinTTL/3 ≈ 667 ms, covers a keep-alive round trip many times
// over: measured on loopback with the machine busy (load average 5–8 on 2
// cores), a median of 0.13 ms, a 99th percentile of 1.6 ms and a maximum
// of 1.9 ms over 200 keep-alives (TestMinTTLMargin logs it). A Request.TTL
// below MinTTL fails with an error matching dlock.ErrInvalidTTL; a server
// with a longer election timeout may grant a longer lease than asked,
// which only delays the takeover after a crash.
//
// A lease that etcd reports gone (a keep-alive or a transaction answers
// "lease not found"), or a shared lease that was not renewed within its
// TTL, is retired: later acquisitions get a new lease, and every lock on
// the old one is lost.
//
// Sharing a lease has one consequence: a non-reentrant lock is kept alive
// as long as its shared lease is renewed for any lock of the Backend. When
// the Client gives a lease up without releasing it (it expired locally:
// WithAutoRenew(false), or renewals failed until its deadline), or a
// release fails (the server unreachable), the Backend deletes the entry
// itself: in the background, retried every 50 ms doubling up to 1 s until
// it succeeds, and at once before the Backend queues on (or tries) the
// same lock again, so that its own leftover does not head the queue. (A
// lowered count of an owner's entry whose write may have been applied is
// never retried: see Reentrancy.)
// Close takes back the Backend's holds of owners' entries (the count is
// lowered, the entry deleted at zero) and revokes its shared and spare
// leases, deleting whatever is left on them.
//
// # Retries
//
// A call of the Backend makes at most these bounded retries, all within
// its context, each only when it is safe: TryAcquire tries again, up to 3
// attempts, when the lease it used turns out gone (nothing was created on
// it); a change of an owner's hold count or the move of an entry to a
// longer lease is a compare-and-swap retried up to 16 times when another
// holder of the same owner changed the entry meanwhile; ForceRelease reads
// the holder again, up to 16 times, when the holder changed between its
// read and its delete; Wait queues again, up to 3 times, when its lease
// is found gone. The Backend pauses only in Wait and in its background
// goroutines (between passes removing its leftovers, before re-reading a
// held entry whose watch failed, before re-opening the waiters' watch
// stream).
//
// # Waiting
//
// etcd's only waiting mode is the queue: Request.FIFO is ignored and
// waiters are always served in the order their entries were created. Each
// waiter watches its immediate predecessor (the entry with the largest
// create revision below its own) for deletion and, if it is third or
// further in line, also the entry before the predecessor; a deletion thus
// wakes at most two lock waiters, never a herd (readers and permits wait
// by their own rules: see Permits and read holds). When the entry before the
// predecessor goes (usually its holder released), the waiter re-reads its
// position while the predecessor holds the lock; if the predecessor now
// heads the queue, its deletion is the grant, with no request after it.
// Otherwise (a waiter ahead gave up) the re-read happens after the
// predecessor's deletion. A re-read is one Range (the waiter's entry and
// the two ahead of it), serializable (no round of consensus) and accepted
// only if it reflects the deletion's revision. The
// watches start at the server's current revision: etcd serves watches that
// start in the past from its history only every 100 ms, which caps
// concurrency.Mutex at about ten hand-offs per second per waiter; a
// watch's creation revision tells whether the entry must be read once
// more. A Backend keeps one watch per entry name, shared by its waiters
// and kept open up to 1 s after the last one is done (at most 16 idle;
// what an idle watch reports is read by its next user, or dropped with
// it): a Backend that takes the same lock again and again usually finds
// the entries ahead of its own under the same names (entry names are
// reused, and steady contenders keep their order in the queue), so its
// next wait creates no watch and needs no extra read (such a watch
// predates the read that found the entry). One idle watch that never
// reports anything keeps the Backend's watch stream open between waits
// (the etcd client closes a stream with its last watch, and a new one
// for every wait made each watch a third dearer). A cancelled Wait deletes its
// entry at once with a fresh context (waiting at most 1 s for an
// unreachable server, then leaving it to a background retry and to the
// lease's expiry).
//
// A create transaction whose outcome is unknown (ctx ended or the reply
// was lost) is undone the same way, identifying its own attempt only: the
// entry is deleted only if it is on the lease the attempt used, has the
// value "1 TOKEN" and was created after the revision of any entry the
// Backend holds under the same name. An owner's attempt uses a private
// lease of its own (or a spare one carrying nothing), so its clean-up
// never touches the entry of an earlier grant of the same owner (on
// another lease); a non-reentrant token that holds the lock under the
// same name is protected by the revision.
//
// TryAcquire is one transaction (after a lease grant for an owner's
// entry, unless a spare lease is at hand): it creates the entry only if no
// entry exists under the lock's directory (nobody holds or waits), so it
// never overtakes queued waiters and writes nothing when it fails. A
// request that is not reentrant, from a token that already holds or waits
// for the lock, is not granted (an error matching dlock.ErrNotAcquired).
//
// # Fencing and guarded writes
//
// The fence of a grant is the entry's create revision: etcd revisions
// only grow, so fences strictly increase per key (and across keys of one
// cluster). Guard returns an etcd comparison, CreateRevision(entry) ==
// fence, for users' own transactions on the same cluster: the write is
// applied only while the lock is held, whatever the local clocks say.
//
// Release deletes the entry in a transaction guarded by the same
// comparison, so a holder whose lease expired never deletes the entry of
// a newer holder (unlike a plain delete by key: etcd issue #22082); it
// gets an error matching dlock.ErrNotHeld.
//
// # Loss
//
// A lock is lost when its entry is deleted: its lease expired or was
// revoked, or someone deleted the key. The Backend learns it from
// deletion watches and from keep-alives that find the lease gone. While
// it holds fewer than 64 locks, each granted entry has a watch of its own
// (all served by one goroutine per Backend). The watch of a lock starts
// 50 ms after its grant, from the grant's revision, so holds shorter than
// that cost no watch (creating and cancelling one costs the server about
// as much as a read) and a deletion in between is still reported, at most
// 50 ms late (a lease cannot expire that early: only a revocation or
// deletion by someone else can). From 64 held locks on, the Backend
// instead watches its whole key prefix for deletions, once, from the
// oldest grant whose lock has no running watch of its own (locks whose own
// watch already runs keep it), and routes each deletion to the lock whose
// entry it deleted (a watch per lock costs a round trip to create and
// about 10 KB in the etcd client: 100,000 held locks cost 100,000 watches);
// it goes back to a watch per lock below 16 held locks, since the prefix
// watch also receives every other client's deletions under the prefix.
// If the prefix watch ends (its revision compacted during a reconnection,
// say), the Backend reads its held locks again, 128 per transaction,
// before it watches anew. The Backend then calls
// the dlock.LossNotifier callbacks (the Client closes Lease.Done, cancels
// Lease.Context with dlock.ErrLost) and Refresh returns an error matching
// dlock.ErrNotHeld. While the server is unreachable nothing can be
// learnt: the Client's watchdog declares the lease lost at its local
// deadline (Lease.Expires), before etcd can expire it.
//
// After an outage the etcd client reconnects with gRPC's backoff, which
// by default grows from 1 s to 120 s: a client whose server was down for
// a while may stay away from it for minutes after it is back, and its
// waiters wait that long. Cap it when creating the client, as the dlock
// command does:
//
//	clientv3.Config{..., DialOptions: []grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
//		Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
//		MinConnectTimeout: time.Second,
//	})}}
//
// # Reentrancy
//
// A reentrant request (dlock.WithOwner) whose owner token's entry heads
// the queue raises the COUNT in the entry's value (compare-and-swap on its
// mod revision), makes the entry live for its TTL (see Leases) and gets
// the same fence; Release lowers it and deletes the entry at zero. The
// count lives on the server, so it is right whichever Backend asks: two
// Clients (processes) sharing an owner id both hold the lock, each
// renewing the entry's lease. A reentrant request whose owner is still
// queued joins the queued entry (one more claim) and is granted with it.
// Within one Client only the first hold of an owner reaches the Backend
// (the Client counts the others).
//
// A raise whose reply is lost (the context ended or the connection broke
// mid-call) may have raised the count without any Client knowing. Such a
// leftover is bounded: the entry is on a private lease renewed only by the
// holds that Backends track, so once every tracked hold is released (or
// given up) nobody renews it and the lock is freed when the lease expires,
// at most its TTL after the last renewal. A shared lease would keep it
// alive as long as the Backend holds any other lock. The same bound covers
// a lowering whose reply is lost (a Release, or a given-up hold taken
// back): it is never sent again, since a count does not say whose holds it
// counts, and a second decrement would take another Backend's hold, and
// the lock from under it.
//
// # Permits and read holds
//
// A semaphore's permits (dlock.KindPermit) and a read-write lock's read
// holds (dlock.KindRead) are entries in the same directory as the lock's,
// under names of their own:
//
//	DIR + "~r." + ID + "." + SLOT            a reader
//	DIR + "~p" + N + "." + ID + "." + SLOT   a permit of a semaphore of N
//
// with ID and SLOT as for a non-reentrant lock (slots reused, so a busy
// key does not pile up dead keys), the value "1 TOKEN" and the Backend's
// shared lease of the TTL. Everything else is the lock's: the create
// revision is the hold's fence, Refresh and RefreshMany renew the lease,
// Release deletes the entry comparing its create revision, the deletion
// watches report a loss (dlock.LossNotifier), a given-up hold is deleted
// in the background, and a dead holder's entry goes with its lease, within
// its TTL. Lock entries (a hex token name, or a base32 ID) all sort below
// "~", so a transaction compares the three ranges at once: [DIR, DIR+"~")
// the lock's entries (a read-write lock's writers, held or queued), the
// prefix DIR+"~r." the readers, DIR+"~p" the permits. Permits and read
// holds are never reentrant, and a request of another kind than the hold
// it names (a read hold released as a lock) gets dlock.ErrNotHeld.
//
// An acquisition creates its entry in one transaction that compares what
// its kind excludes: a reader, no permit entry; a permit, no lock entry,
// no reader and no permit entry outside its own sub-range DIR+"~pN." (a
// key range per N; two range comparisons: nothing in the directory below
// or above the sub-range), so that holders disagreeing on N get an error
// matching dlock.ErrPermits, checked by the server as the entry is
// created, and a permit on a key held as a lock, or a reader on a
// semaphore, one matching dlock.ErrWrongType. A lock on a key holding
// permits queues behind them. The same transaction reads what decides the
// grant:
//
//   - A reader is granted when no lock entry is older than its own: it
//     reads the newest lock entry (all are older), and waits for its
//     deletion, reads again (one Txn: its own entry and the newest lock
//     entry older than it) and so on. A writer's queued entry thus keeps
//     every later reader out (no writer starvation), and readers already
//     holding go on; the writer is granted when it heads the queue (the
//     lock's rule, unchanged), so its fence, a later create revision, is
//     above every fence issued for the key before it, readers' included.
//     Readers queued behind a writer are all granted when it releases,
//     together, unless another writer queued between them. A writer
//     that waits always queues (the Client waits through Wait here), so
//     Request.Waiting needs nothing more: the queued entry is the
//     writer's claim, removed by its Wait when it gives up (a Release
//     withdrawing it finds nothing to do). TryAcquire of
//     a reader also requires no lock entry at all (no writer holds or
//     waits), so it never overtakes a writer, and writes nothing if it fails.
//   - A permit is granted when fewer than N entries of its semaphore are
//     older than its own (holders and waiters alike: arrival order). It
//     reads its own and the N entries just ahead of it (newest first,
//     limit N+1) and, while there are N, waits for the deletion of any of
//     those N, then reads again. An entry further ahead going does not
//     concern it (the N just ahead stay the same and it still has N
//     ahead), so a released permit wakes only the waiters with that entry
//     among their N predecessors: at most N waiters, never the whole
//     queue. With N = 1 it is the lock's chain. TryAcquire creates the
//     entry and counts the semaphore's entries in the same transaction;
//     with more than N (ahead of it: waiters included, so it never
//     overtakes them) it deletes its entry again, one more request.
//
// An uncontended acquire and release costs two requests either way, the
// create and the delete transaction, as a lock's (measured by
// TestKindRequests, with the lease keep-alive about every TTL/10 on
// top); contended, about one more, the waiter's read after its wake-up
// (measured by TestKindRequestsContended: 3.0 KV requests per permit
// with 4 Clients sharing 2 permits, 3.1 per hold with 3 readers and a
// writer, plus 0.1 watch creations). A waiter renews its entry's lease every TTL/3, as a lock's.
// Inspect reports the holders of such a key in Info.Holds (owner, fence,
// lease TTL): the readers older than the first lock entry, or the first N
// permits, with one TimeToLive per distinct lease; ForceRelease deletes
// them all.
//
// # Leader election
//
// An election is the lock of its key (dlock.Proclaimer): the leader is
// the entry heading the queue, its term the entry's create revision. The
// campaigner's value is written with its entry when it queues (or tries),
// so the new leader's value is there as it is granted, and SetValue
// (Proclaim) rewrites it, keeping the entry's lease, in a compare-and-swap
// on its create and mod revisions: an entry deleted or taken again is not
// written (dlock.ErrNotHeld). Moves to a longer lease keep the value.
// Inspect reads it with the holder (Info.Value). The Backend is no
// dlock.Notifier (the Client would then wait for locks by retrying
// instead of queuing), so Election.Observe reads the leader every TTL/3
// (at most every second).
//
// # Inspection
//
// Inspect (dlock.Inspector) reads the lock's queue in one transaction —
// the entry heading it (the holder: owner token, fence, hold count) and
// the number of entries behind it (the waiters) — and the holder lease's
// remaining TTL (etcd reports whole seconds, rounded down; Inspect
// reports the upper end, one second more but at most the lease's TTL, so
// the lease ends within Info.TTL). ForceRelease
// (dlock.ForceReleaser) deletes the holder's entry if it is still the
// incarnation read (compare on its create revision); the next waiter then
// holds the lock, and the holder's Backend learns of it from its deletion
// watch (an owner's entry also from its next renewal, which reads the
// entry) and reports the lease lost (dlock.LossNotifier).
//
// # Structure
//
// A Backend's state is in parts, each in the file named for it, under the
// Backend's one mutex: leases (lease.go), held entries and their deletion
// watches (held.go, prefixwatch.go), entry names (keys.go), orphans
// (orphans.go) and the waiters' entry watches (entrywatch.go); the
// operations are in acquire.go, wait.go, refresh.go, release.go and
// admin.go; permits and read holds in kind.go, kindwait.go and
// kindadmin.go (their names are in keys.go's slots too); a leader's value
// in election.go.
package etcdlock
