// Package redislock is the Redis backend of dlock: locks on a single Redis
// server, a Sentinel-managed primary (redis.NewFailoverClient) or a Redis
// Cluster, through any go-redis v9 client (see Client).
//
//	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379"})
//	c := dlock.New(redislock.New(rdb), dlock.WithTTL(10*time.Second))
//	defer c.Close()
//
// The Backend does one round trip per operation and holds no policy: the
// dlock.Client waits, renews and reports lost leases.
//
// # Keys
//
// A lock on KEY uses these names, which share the Redis Cluster hash tag
// {KEY}, so they live in one slot and the scripts may touch them together:
//
//	dlock:{KEY}        the lock: a hash {owner, count, fence[, wait][, claim]}
//	                   whose TTL is the lease's; owner is the owner token,
//	                   count the reentrant hold count, fence the grant's
//	                   fencing token, wait a flag set when someone found it
//	                   held, claim a flag set while a lock handed to a FIFO
//	                   waiter is not claimed yet
//	dlock:{KEY}:fence  the fence counter: the last fence issued for KEY, a
//	                   string with no TTL (one per key ever locked)
//	dlock:{KEY}:q      the FIFO queue (only while FIFO waiters wait): a
//	                   sorted set of waiters by arrival number
//	dlock:{KEY}:hb     the FIFO waiters' heartbeats: a sorted set of the
//	                   same waiters by deadline (server time, ms); both
//	                   expire after twice the waiter TTL without a heartbeat
//	dlock:{KEY}:rel    the release channel, PUBLISHed to when the lock is
//	                   freed while someone waits for it (without WithFIFO)
//	dlock:wake:ID      a Backend's wake channel (ID: 26 random characters,
//	                   one per Backend): a release that hands the lock to
//	                   one of this Backend's FIFO waiters PUBLISHes here
//
// The prefix "dlock:" is set with WithPrefix. A key that starts with '}'
// or '\' gets a leading '\' inside the braces (an empty tag would split
// the names over several slots). Backend.LockName returns the lock's name.
//
// # Scripts
//
// Each operation is one Lua script, in the .lua files of this package
// (embedded with go:embed; fence.lua and queue_lib.lua hold the functions
// several share and are included where a script needs them, after its
// fast path), run with EVALSHA and, when the server answers NOSCRIPT
// (after a restart or SCRIPT FLUSH), again with the source. Every
// redis.call inside a script costs 1–2 µs of server time on Redis 7.0, so
// the common cases are short: taking a free lock nobody queues for makes
// five calls (EXISTS of the lock and its queue, TIME, SET ... GET of the
// counter, HSET, PEXPIRE), releasing it two (HMGET, DEL):
//
//   - acquire.lua takes a free lock (new hash, count 1, a new fence),
//     re-enters one the token holds (count + 1, same fence, TTL refreshed)
//     or reports the holder's PTTL, which bounds the waiter's next wait; a
//     free lock with live FIFO waiters goes to the first of them instead;
//   - release.lua compares the owner token (and the grant's fence), then
//     decrements the count, or hands the lock to the first live FIFO
//     waiter, or deletes it, PUBLISHing on the release channel if an
//     attempt found the lock held meanwhile;
//   - refresh.lua compares the owner token and fence and sets the TTL;
//     RefreshMany sends one refresh per lease in ONE pipeline (one round
//     trip per server; a ClusterClient splits it by node);
//   - queue.lua is one step of a FIFO wait (join, heartbeat, claim), and
//     leave.lua takes a waiter that gives up out of the queue;
//   - acquire_all.lua takes several locks of one slot, all or none;
//   - inspect.lua reads a lock, or deletes it for ForceRelease.
//
// Release and Refresh change nothing when the token does not hold the lock
// and return an error matching dlock.ErrNotHeld. A lock or fence key that
// holds another type of value (a user's list under the same name) is never
// overwritten: the call fails with an error matching dlock.ErrWrongType that
// names the key. So do the queue keys.
//
// # Fencing
//
// acquire.lua issues fence = max(last fence + 1, server TIME in µs) and
// stores it in the fence counter. While the counter lives, fences strictly
// increase. They stay strictly increasing when the counter is lost too
// (DEL of every key, a restart without persistence, an older snapshot
// restored, a failover to a replica that lagged): the next fence is at
// least the server's time, and every fence issued before was at most the
// server's time when it was issued. A fence runs ahead of the clock only
// if a key is granted more than once per microsecond, which cannot happen:
// each grant needs a release or an expiry in between, and every script
// takes more than a microsecond. The assumption is that the server clock
// (after a failover, the new primary's clock) never steps back by more
// than the time between the last grant before the loss and the first one
// after it. µs since 1970 stay exact in Lua's doubles (below 2^53) until
// the year 2255.
//
// # What it does not protect
//
// Redis replicates asynchronously: a lock granted by a primary that fails
// before the write reaches its replica is gone after a Sentinel or Cluster
// failover, and a second client can then take it while the first still
// believes it holds it. The fences stay increasing (see above), so a
// resource that checks them (package fence) still rejects the older
// holder's writes; mutual exclusion alone is not guaranteed across a
// failover. Use Redlock (package redlock) over independent servers, or etcd
// or ZooKeeper, when that matters. Lock expiry runs on the server's clock:
// a clock that jumps forward expires locks early.
//
// WithReplicas narrows the gap: every acquisition is confirmed by WAIT n
// (sent in the same pipeline, on the same connection, as the script), and
// one that fewer than n replicas acknowledged in time is released and
// fails with ErrNotReplicated. A promoted replica that had acknowledged
// has the lock. It stays a narrowing, not a guarantee: replication is
// still asynchronous (WAIT only reports what happened), a failover may
// pick a replica that had not acknowledged when n is smaller than the
// number of replicas, a replica may restart empty, renewals and releases
// are not confirmed (after a failover a lease may have an older TTL than
// its holder computed, a released lock may come back until it expires),
// and WAITAOF (persistence on the replicas, Redis 7.2) is not used. FIFO
// queues and heartbeats are replicated like any write; after a failover,
// waiters that the new primary lost put themselves back at their arrival
// number with their next heartbeat.
//
// # Waiting
//
// Without WithFIFO, waiters retry: the Backend implements dlock.Notifier,
// and waiters are woken by the release channel, over ONE pub/sub connection
// per Backend shared by all its waiters (Subscribe returns once the server
// confirmed the subscription; each channel is subscribed while it has
// waiters). The Client bounds each wait by the holder's remaining TTL, so a
// lost message (a reconnect, an expiry, which publishes nothing) costs at
// most that. Retrying is not fair: the releaser may take the lock again
// before the woken waiters get to it.
//
// With WithFIFO, the Backend is a dlock.Waiter: waiters queue in arrival
// order on the server, and the release of a lock hands it over, inside
// release.lua, to the first live waiter (new fence, reserved for it for
// the waiter TTL), and PUBLISHes on that waiter's Backend's wake channel
// only: one release wakes one waiter, which holds the lock from that
// message on (it carries the fence) and confirms it with its lease's first
// renewal, a third of the waiter TTL later (without auto-renew: before
// Acquire returns); until then the lease's Expires is the reservation's
// end. Waiters heartbeat every waiter TTL/4 (server time, TIME in
// the script); a release skips waiters whose heartbeat is older than the
// waiter TTL, and a lock handed to a waiter that died is free again after
// the waiter TTL, so a dead waiter delays the others by at most the waiter
// TTL plus a quarter of it (DefaultWaiterTTL 400ms: 500ms). A waiter whose
// context ends leaves the queue at once, passing on a lock it was just
// handed. A contended FIFO acquisition costs two requests (join, release)
// plus a heartbeat per 100ms of waiting and the confirming renewal when the
// lock is held longer than a third of the waiter TTL; see Backend.Wait and
// BenchmarkContention.
//
// In a Cluster the channels are ordinary ones (PUBLISH reaches every node),
// so one connection hears every release. A *redis.Ring is refused for that
// reason: its shards do not share messages.
//
// # Several keys
//
// The Backend implements dlock.MultiAcquirer for dlock.Client.AcquireMany:
// keys whose locks share a Redis Cluster slot (on a single server or
// behind Sentinel: all keys) are taken in one script, all or nothing, each
// with its own fence; Groups computes the slots locally with CRC16, as
// Redis does. Keys of different slots are taken group by group in sorted
// order by the Client, so callers with overlapping key sets never
// deadlock. Keys that should be locked together cheaply can share a slot
// with a hash tag of their own: "{order:1001}:items" and
// "{order:1001}:payment" do.
//
// # Contexts
//
// Every call returns when its context ends, whatever the go-redis timeout
// settings: with a context that can be cancelled, the command runs on a
// helper goroutine that finishes within the client's ReadTimeout, and a
// grant that arrives after the caller gave up is released at once.
package redislock
