// Package dlock is a toolkit for distributed locks that stay correct: one
// API over interchangeable backends, fencing tokens from every backend, a
// watchdog that renews leases and tells you when one is lost, waiting by
// notification instead of polling, and reentrancy by explicit owner.
//
//	c := dlock.New(redislock.New(rdb), dlock.WithTTL(10*time.Second))
//	lease, err := c.Acquire(ctx, "order:1001") // waits per strategy; ctx bounds only the wait
//	if err != nil { ... }                       // errors.Is(err, dlock.ErrNotAcquired) [+ ctx.Err()]
//	defer lease.Release(context.WithoutCancel(ctx))
//	work, cancel := lease.Context(ctx)          // cancelled with cause dlock.ErrLost on loss
//	defer cancel()
//	fence := lease.Fence()                      // strictly increasing per key: give it to the resource
//
// # Safety model
//
// A lease-based lock cannot promise mutual exclusion by itself: a holder
// paused (GC, SIGSTOP, a slow disk) past its TTL keeps running while the
// server hands the lock to someone else. dlock promises what can be
// checked:
//
//   - A grant never overlaps another owner's live lease on the server.
//   - Fences strictly increase per key: each grant's Fence is larger than
//     every earlier grant's, also after expiry, deletion of the keys and
//     (Redis) a restart without persistence. A resource that rejects
//     writes with a fence lower than one it has seen (package fence)
//     rejects every stale holder's write.
//   - Expires is conservative: invoke time of the last successful acquire
//     or renewal + TTL − drift (TTL/100 + min(2ms, TTL/4)). While
//     time.Now() is before Expires, no one else can have been granted the
//     lock, clock drift within that bound assumed.
//   - A lease is never lost silently: Done closes, Err matches ErrLost,
//     every Context from Lease.Context is cancelled with cause ErrLost, and
//     the WithOnLost hook runs.
//
// # The lease model
//
// A lock on a key is held on the server by at most one owner token: one
// grant with a fence, a hold count and a deadline. A Lease is one hold of
// it in one Client. The rules below make "a grant never overlaps another
// owner's live lease" hold under reentrancy, Refresh and cancellation:
//
//   - Deadlines never move back. Every operation that sets a lock's
//     lifetime (a grant, a re-entry, Refresh, a watchdog renewal, a FIFO
//     hand-off's confirmation) sets the deadline to the later of the
//     current one and now + TTL. A re-entry with a shorter TTL, a
//     Refresh to a shorter TTL or a late renewal carrying an older TTL
//     never lets the lock go before another hold's Expires.
//   - Expires never exceeds the server's deadline: it is the invoke time
//     of the last successful operation on the hold plus its TTL minus the
//     drift. After Refresh it is the later of the two values.
//   - Refresh, renewals and Release act only on the grant they came from:
//     they compare the owner token and the fence, so a hold of an earlier
//     grant (lost, then granted again to the same owner) changes nothing.
//   - Reentrancy within a Client is the Client's: the holds of one
//     (key, WithOwner id) in a Client share one server hold. The first is
//     taken on the server; later ones join it without a round trip (or
//     with one Refresh when their TTL reaches past every live hold's
//     Expires); the release of the last live hold gives it back. Goroutines
//     may share an owner id: first acquisitions of one owner are
//     serialised, so they never race on the server. Two Clients (or
//     processes) sharing an owner id re-enter each other's hold on the
//     server, where backends support it (ZooKeeper keeps owners per
//     session); each Client then gives back its own share, exactly once:
//     by the last release or by Close, or, on a backend that reports
//     losses (LossNotifier), by the backend when the last lease of the
//     share ended without giving it back (a lease lost locally) — then
//     the Client sends no release of its own.
//   - A re-entry whose context ends mid-flight leaves nothing in the
//     Client; on the server it leaves at most a raised hold count or a
//     later deadline, and the lock is then free at most one TTL after the
//     owner's last renewal.
//   - A hold lost (the server reports the grant gone, or it expired
//     unrenewed) blocks further re-entries by its owner in that Client,
//     with an ErrLost error, until it is released: nested code must not
//     silently take a fresh lock inside a compromised critical section.
//     A server-reported loss ends every hold of the grant in the Client.
//   - Close ends waits in progress, gives back grants that arrive while
//     it closes, releases every lease, then closes the backend: after
//     Close returns, nothing the Client took stays held (unless the server
//     did not answer within the release timeout; it then expires).
//
// # Policy lives in the Client
//
// Backends translate one operation into as few round trips as the server
// allows (see Backend for what they may do on their own). The Client:
//
//   - waits with a stateless WaitStrategy (NoWait, Constant, Exponential
//     with full jitter, Limit); a release notification (Notifier) ends a
//     wait early and each wait is bounded by the holder's remaining TTL;
//     backends with a server-side queue (Waiter) serve WithFIFO waiters in
//     arrival order;
//   - renews every lease from one watchdog timer per Client, every
//     TTL/3, batching renewals (BatchRefresher: one round trip per server
//     for every 10,000 leases, the leases that expire first first);
//     a failing renewal is retried until the lease could have expired, then
//     the lease is lost;
//   - keeps reentrancy bookkeeping (WithOwner) as described above.
//
// # Beyond the mutex
//
// Client.Semaphore hands out at most N permits on a key and Client.RWLock
// shares a key among readers or gives it to one writer. Every permit and
// read hold is a Lease like a lock's: renewed by the watchdog, lost with
// a signal, carrying its own fence from the key's sequence, so a writer's
// fence is above every fence issued before it, readers' included. A
// writer that waits keeps new readers out (Request.Waiting), so a stream
// of readers cannot starve it; it withdraws the claim when it gives up.
// Holders that disagree on N get ErrPermits; a permit or read hold asked
// of a key held otherwise gets ErrWrongType, and a lock asked of a key
// whose permits are held gets ErrWrongType or waits for the permits to
// go, as the backend documents. Backends offer these kinds through
// KindSupporter; the others answer errors.ErrUnsupported.
//
// Client.Election elects one leader per key: Campaign waits for the
// key's lock and stores the leader's value with it (Proclaimer), Leader
// and Observe read it, the term is the lock's fence, and a leader that
// loses its lease learns it from the Lease like any holder.
//
// # Several keys at once
//
// Client.AcquireMany takes keys in sorted order, one group at a time (a
// group is what the backend takes atomically, such as keys of one cluster
// slot). While a later key is awaited the earlier ones stay held and
// renewed; with WithAutoRenew(false) the wait for a later key ends before
// an earlier lease would expire. WithFIFO applies to keys taken one by
// one; a group taken in one step waits by retrying on notifications; with
// WithOwner every key is taken on its own.
//
// # Holds for schedulers
//
// WithMinHold keeps a lock on the server until a minimum time after its
// grant, so a job that finishes fast on one instance does not run again
// on an instance whose clock or schedule lags. A Release inside that time
// ends the lease at once (Done closes, Err is ErrReleased) but first
// extends the server's hold to the minimum's end, retrying a failed
// extension as the watchdog retries a renewal, until a little before the
// lock's current expiry; the lock is given back when the minimum ends.
// If the extension never succeeds, Release returns an error matching
// ErrMinHold and the lock is freed at its current expiry, earlier. If
// the Client closes or the process ends first, the lock expires by
// itself, at least the minimum and at most its TTL after the grant
// (unless the backend's Close ends the session or lease the lock lives
// in: then Close frees it). WithMaxHold ends a lease a fixed time after
// its grant whatever the watchdog would do (ErrLost and ErrMaxHold) and
// gives the lock back.
//
// # Backends
//
//	backend            package     fence                      waiting                  lost when
//	in-process         memlock     Store counter              notify, FIFO queue       TTL runs out unrenewed
//	Redis (1 node,     redislock   server TIME µs, above a    FIFO queue, release      renewal finds another owner,
//	 Sentinel, Cluster)            tombstone's fence          hands over to one        or no renewal until Expires
//	Redlock (N nodes)  redlock     max over quorum, adopted   retry on notifications   no quorum renewal until Expires
//	                               by the granting nodes      from every node
//	etcd               etcdlock    create revision            FIFO, watch predecessor  lease expired/revoked, key deleted
//	ZooKeeper          zklock      czxid                      FIFO, watch predecessor  session expired, node deleted
//	PostgreSQL         pglock      a sequence                 LISTEN/NOTIFY, one       no renewal until Expires;
//	 (lease table or                                          waiter woken per release session mode: session ended
//	 session advisory)
//
// Semaphores, read-write locks and leader election run on memlock,
// redislock, etcdlock and zklock; redlock and pglock answer
// errors.ErrUnsupported.
//
// Every backend passes the conformance suite in package dlocktest against
// a real server.
//
// # Errors
//
// Every error string starts with "dlock:". Match with errors.Is:
// ErrNotAcquired (and the context's error when the context ended the
// wait), ErrLost, ErrNotHeld, ErrReleased, ErrClosed, ErrInvalidKey,
// ErrInvalidTTL, ErrInvalidOption, ErrWrongType, ErrMaxHold, ErrMinHold,
// ErrPermits (semaphores), ErrNotLeader and ErrNoLeader (elections);
// backends add their own (redislock's ErrNotReplicated). Failures of one
// node among several are *NodeError values joined with errors.Join.
package dlock
