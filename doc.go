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
// # Policy lives in the Client
//
// Backends do one round trip per operation and never retry, sleep or
// renew on their own. The Client:
//
//   - waits with a stateless WaitStrategy (NoWait, Constant, Exponential
//     with full jitter, Limit); a release notification (Notifier) ends a
//     wait early and each wait is bounded by the holder's remaining TTL;
//     backends with a server-side queue (Waiter) serve WithFIFO waiters in
//     arrival order;
//   - renews every lease from one watchdog goroutine per Client, every
//     TTL/3, batching renewals (BatchRefresher: one round trip per server);
//     a failing renewal is retried until the lease could have expired, then
//     the lease is lost;
//   - keeps reentrancy bookkeeping (WithOwner) and refuses to re-enter a
//     lock whose earlier hold was lost.
//
// # Backends
//
//	backend            package     fence                      waiting                  lost when
//	in-process         memlock     Store counter              notify, FIFO queue       TTL runs out unrenewed
//	Redis (1 node,     redislock   max(counter+1, TIME µs)    pub/sub notify;          renewal finds another owner,
//	 Sentinel, Cluster)                                       WithFIFO: queue with     or no renewal until Expires
//	                                                          server-side hand-off
//	Redlock (N nodes)  redlock     max over quorum, written   pub/sub on every node    no quorum renewal until Expires
//	                               back to a majority
//	etcd               etcdlock    create revision            FIFO, watch predecessor  lease expired/revoked, key deleted
//	ZooKeeper          zklock      czxid                      FIFO, watch predecessor  session expired, node deleted
//
// Every backend passes the conformance suite in package dlocktest against
// a real server.
//
// # Errors
//
// Every error string starts with "dlock:". Match with errors.Is:
// ErrNotAcquired (and the context's error when the context ended the
// wait), ErrLost, ErrNotHeld, ErrReleased, ErrClosed, ErrInvalidKey,
// ErrInvalidTTL, ErrInvalidOption, ErrWrongType. Failures of one node
// among several are *NodeError values joined with errors.Join.
package dlock
