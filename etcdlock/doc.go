// Package etcdlock is the etcd backend of dlock: fair (FIFO) locks with
// fencing tokens and a lost-lease signal, on an etcd v3 cluster, behind
// the same API as every dlock backend.
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
// owner token. The entry is created with the Backend's lease in a
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
// A Backend has ONE etcd lease per distinct TTL (in whole seconds, rounded
// up) shared by all its locks and queue entries; with one TTL, as with a
// dlock.Client's WithTTL, that is one lease, granted once. The Backend
// starts no keep-alive stream of its own: Refresh and RefreshMany send one
// KeepAliveOnce for the shared lease, so the Client's watchdog (every
// TTL/3) drives renewal. Two exceptions renew the lease outside the
// watchdog: an acquisition sends a keep-alive concurrently with its
// transaction unless the lease was renewed since the call began (so the
// lock lives on the server at least TTL from the call, as the Client
// assumes) or at most TTL/10 before it (then the grant's Grant.Since is
// that renewal, from which the Client counts the lock's lifetime: its
// deadline is at most TTL/10 earlier than the TTL asked, and a Backend
// taking locks often sends one keep-alive per TTL/10 instead of one per
// acquisition), and a waiter in Wait renews the lease every TTL/3 while
// it is queued (the Client renews only granted locks; without it a queue
// entry would expire after one TTL).
//
// The minimum TTL is MinTTL (2 s): etcd counts lease TTLs in whole seconds
// and raises anything below about 1.5 × its election timeout (1 s by
// default). A Request.TTL below it fails with an error matching
// dlock.ErrInvalidTTL; a server with a longer election timeout may grant
// a longer lease than asked, which only delays the takeover after a crash.
// A Refresh with a TTL of another number of seconds moves the lock to the
// Backend's lease of that TTL (all holds of a reentrant owner move
// together).
//
// A lease that etcd reports gone (a keep-alive or a transaction answers
// "lease not found"), or that was not renewed within its TTL, is retired:
// later acquisitions get a new lease, and every lock on the old one is
// lost.
//
// Sharing a lease has one consequence: a lock is kept alive as long as the
// lease is renewed for any lock of the Backend. When the Client gives a
// lease up without releasing it (it expired locally: WithAutoRenew(false),
// or renewals failed until its deadline), or a release fails (the server
// unreachable), the Backend deletes the entry itself: in the background,
// retried every 50 ms doubling up to 1 s until it succeeds, and at once
// before the Backend queues on (or tries) the same lock again, so that its
// own leftover, kept alive by the lease its waits renew, does not head the
// queue. Close revokes the leases, deleting whatever is left.
//
// # Waiting
//
// etcd's only waiting mode is the queue: Request.FIFO is ignored and
// waiters are always served in the order their entries were created. Each
// waiter watches its immediate predecessor (the entry with the largest
// create revision below its own) for deletion and, if it is third or
// further in line, also the entry before the predecessor; a deletion thus
// wakes at most two waiters, never a herd. When the entry before the
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
// lease's expiry). A transaction whose outcome is unknown (ctx ended or
// the reply was lost) is undone the same way.
//
// TryAcquire is one transaction: it creates the entry only if no entry
// exists under the lock's directory (nobody holds or waits), so it never
// overtakes queued waiters and writes nothing when it fails.
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
// mod revision) and gets the same fence; Release lowers it and deletes the
// entry at zero. The count lives on the server, so it is right whichever
// Backend asks. A reentrant request whose owner is still queued joins the
// queued entry (one more claim) and is granted with it.
package etcdlock
