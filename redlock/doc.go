// Package redlock is the Redlock backend of dlock: a lock is held when a
// majority of N independent Redis servers (nodes) hold it, so it survives
// the failure of any minority of them, and its fencing tokens keep
// increasing across node failures.
//
//	rdbs := []*redis.Client{
//		redis.NewClient(&redis.Options{Addr: "10.0.0.1:6379"}),
//		redis.NewClient(&redis.Options{Addr: "10.0.1.1:6379"}),
//		redis.NewClient(&redis.Options{Addr: "10.0.2.1:6379"}),
//	}
//	c := dlock.New(redlock.New(rdbs...), dlock.WithTTL(10*time.Second))
//	defer c.Close()
//
// New takes the clients only (so a slice spreads); NewWithOptions takes a
// slice and options. The nodes must be independent masters: not replicas
// of one another, not shards of one Redis Cluster, ideally on separate
// machines and power. N must be odd and at least 3; the quorum is N/2+1
// (3 of 5 tolerates two failed nodes).
//
// Each node is driven by a redislock.Backend, so a Redlock lock is, on
// each node, exactly a redislock lock (same Lua scripts and key layout,
// see package redislock); this package knows none of them and goes through
// redislock's API (TryAcquireClock, Adopt, Watch, Release, Refresh). It
// adds the quorum, the fence agreement and the node timeout. The Backend implements
// dlock.Backend, dlock.BatchRefresher, dlock.Notifier, dlock.Inspector and
// dlock.ForceReleaser, so the dlock.Client's watchdog, wait strategies and
// release notifications work as on one Redis server. It has no server-side
// queue: the Client refuses WithFIFO.
//
// # Acquiring
//
// One attempt (Backend.TryAcquire):
//
//  1. Every node runs redislock's acquire script concurrently, each call
//     bounded by the node timeout: WithNodeTimeout, by default
//     min(TTL/10, 50ms) (the Redlock description suggests 5–50 ms for a
//     10 s TTL; set it above the network's worst round trip). Every
//     attempt proposes a fence floor: this process's clock
//     in µs plus 5ms (and plus how far ahead of it the nodes' fences were
//     seen), above every floor and fence it proposed or saw before. On a
//     node the script issues max(server TIME in µs, floor) for a free
//     lock, and reports its TIME, or max(floor, a tombstone's fence + 1)
//     for a lock that holds a tombstone (see redislock, Fencing); how far
//     the nodes' clocks run ahead of this process's is learnt from the
//     TIMEs reported (TIME less this process's clock when the reply came:
//     a lower bound, which a stalled client cannot inflate), not from the
//     fences.
//  2. The attempt needs a quorum of grants. As soon as a quorum can no
//     longer be reached it stops waiting for slow nodes (fail fast). Once
//     the outcome is decided, slower nodes get a grace of as long as the
//     decision took (at least 2ms), so that a lease normally holds every
//     node that works, and a failed attempt undoes at once what it knows
//     of.
//  3. When every grant carries exactly the floor, the granting nodes (a
//     quorum) agree already: the floor is the fence, and a node that did
//     not answer or failed is left out of the lease and given back in the
//     background (before, such a node forced a write-back: 1–4% of the
//     uncontended acquisitions on a loaded machine). Otherwise the fence
//     is the maximum over the granting nodes (one more, if that is the
//     floor); it is written back (redislock's Adopt: token and fence) to
//     every node that answered and the lease needs a quorum of
//     confirmations. A reentrant lease is always written back: that
//     renames the attempt's grants to the owner's token (below).
//  4. A reentrant attempt that finds the lock held on a quorum (it may
//     be the owner's: another process sharing the WithOwner id) gives
//     back what it was granted and re-enters: every node runs the acquire
//     script under the owner's token. It re-enters when a quorum of nodes
//     count an earlier hold of the token with one fence, and reports that
//     fence, which it never rewrites; it gives back the holds it added
//     elsewhere (a node that was free, a leftover hold with another
//     fence). Otherwise it gives back every hold it added and reports the
//     lock held, so the Client retries.
//  5. The lease's validity TTL − elapsed − Drift(TTL), elapsed measured
//     from before step 1 and Drift(TTL) = TTL/100 + 2ms, must be positive.
//     The dlock.Client's Lease.Expires is computed the same way from the
//     call's start, so it is never later than the validity.
//
// A failed attempt releases the lock on every node it may have touched,
// including those that did not answer in time (their grant may land
// later; a grant that comes back late is released too). An attempt uses
// its own owner token on the nodes, the lease's token plus "~" and its
// floor in base 36 (floors are unique per attempt; a reentrant attempt,
// whose owner token other processes share, adds "~" and a random id of
// its Backend before the floor). A non-reentrant lease
// of token T with fence F holds the nodes as T~F (base 36): the
// write-back renames the attempt's token to it, and when no write-back
// is needed they are the same: a command of the attempt still in flight
// (on a node that did not answer) can then only grant this lease's token
// on that node, a hold outside the lease that is given back. Either way a
// command of an earlier attempt still in flight can never touch a later
// grant (a later lease has another token). Refresh
// and Release derive T~F from the request's token and fence; Inspect
// reports T. A reentrant lease holds the nodes as T itself, so that
// another process of the same owner can re-enter it; the write-back
// renames the attempt's grants to T once the fence is settled. A grant
// becomes re-enterable only with its final fence, on every node that
// holds it as T: two processes of one owner share one hold and one
// fence, and a re-entry never changes the fence of the hold it joins.
//
// When other owners hold the lock on enough nodes (contention, or a split
// vote between two contenders), TryAcquire reports Grant{OK: false} and
// the Client waits. When more than N − quorum nodes fail, no quorum can
// grant anything: TryAcquire returns an error, one *dlock.NodeError per
// failed node joined with errors.Join after a summary, and the Client's
// Acquire returns it at once (it is not contention).
//
// An uncontended acquisition costs two parallel round trips (acquire,
// release) when the nodes agree on the floor, as redislock's one node
// does, and three (acquire, write-back, release) when they do not (a
// node's clock or a tombstone ahead of the floor, a node that did not
// answer) or the lease is reentrant (WithOwner). A re-entry by another
// process of the owner costs two more (give back, re-enter), and the
// give-back of any hold it added on a node that did not count the
// earlier one. Server commands per node and cycle: 6 (acquire: EVALSHA,
// TIME, SET NX PX GET; release: EVALSHA, GET, DEL or SET of a tombstone).
// A lock taken again within the floor's margin of its release holds that
// release's tombstone; the node's redislock.Backend, which granted it,
// expects it and reads the lock first (EVALSHA, GET, SET: no TIME), so
// that cycle costs 6 too (S1 measured 30.1 per cycle of 5 nodes, the
// excess being write-backs after a node answered late; redsync(5) 20).
// Each node's
// go-redis client should not retry on its own (MaxRetries: -1 and DialerRetries: 1
// in redis.Options; go-redis otherwise retries a refused dial 5 times,
// 100ms apart): Redlock tolerates failed nodes, a retry only spends the
// node timeout, and a command retried after the attempt gave up on it
// lands late.
//
// # Fencing
//
// Redlock as first described gives no fencing token (Kleppmann, "How to
// do distributed locking", 2016). dlock's does, and the tokens strictly
// increase from one lease of a key to the next:
//
// Claim. If lease A of a key was returned with fence Fa, and lease B of
// the same key is granted after A (they cannot overlap: both need a
// quorum), then Fb > Fa, under the clock assumption below.
//
// Argument. Before A is returned, a quorum QA of nodes holds A with fence
// Fa (written back, or granted with exactly Fa). B was granted by a
// quorum QB. Two quorums intersect, so some node n is in both, and B's
// script on n ran after A's hold on n ended. A's hold ended by a release,
// which, when Fa ran ahead of n's clock at the grant, leaves a tombstone
// at Fa until n's clock passes Fa, so B's script issued either more than
// the tombstone or at least its TIME, which is past Fa once the tombstone
// is gone;
// or by an expiry, a lease TTL after the grant, when n's TIME is past Fa
// as long as Fa ran ahead of n's clock by less than the TTL. Fb is the
// maximum over QB, so Fb ≥ fb,n > Fa.
//
// Assumptions, and where they fail. A fence runs ahead of a node's clock
// by the floor's margin (5ms) plus how far the fastest node's clock runs
// ahead of the others'. So fences strictly increase as long as the nodes'
// clocks agree to within the lease TTL minus 5 ms, and no node of QA ∩ QB
// restarts empty within that margin after A's hold ended there; a node
// that restarts empty issues its TIME, which is past Fa under the same
// assumption. Keys left behind by a fence ahead of a clock (tombstones)
// expire when the clock passes the fence.
//
// # Mutual exclusion and the delayed-restart rule
//
// A lease is valid until its Expires; after that another owner may get the
// lock. While it is valid, a quorum of nodes holds it, so no other quorum
// can form, as long as no node forgets a lock it holds. A node that
// crashes and restarts empty forgets. Rule: a crashed node must stay out
// for longer than the longest TTL in use (then every lease it held is
// either renewed on a quorum without it or has expired), or run with
// appendonly yes and appendfsync always (every write is on disk before it
// is acknowledged). Without either, an immediate restart can make two
// valid leases: A holds nodes 1–3, node 3 restarts empty at once, B takes
// 3, 4 and 5. The tests of this package show both sides
// (TestDelayedRestartRule). Redis' own expiry runs on each node's clock:
// a clock that jumps forward expires locks early, which the drift
// allowance does not cover; keep NTP slewing, not stepping.
//
// Clock pauses of the client (GC, a stopped VM) are what fencing is for: a
// holder that wakes up after its lease expired still writes with its old,
// lower fence, and a resource that checks fences (package fence) rejects
// it.
//
// # Refresh, release and waiting
//
// Refresh extends the lock on every node concurrently and succeeds when a
// quorum extended it within the validity; it reports dlock.ErrNotHeld when
// a quorum says the owner does not hold it (the Client then loses the
// lease), and any other failure as an error the watchdog retries until the
// lease could have expired. Nodes that lost the lock (a restart) are not
// re-acquired: the lease runs on the nodes that still hold it.
// RefreshMany refreshes a batch in one pipeline per node. Release releases
// on every node and succeeds once a quorum released it. A Release that
// finds the lease on fewer than a quorum (a straggler node that still held
// it, the others not) reports dlock.ErrNotHeld: no quorum held the lease,
// so it had been lost; the stragglers are released all the same.
//
// Subscribe (dlock.Notifier) watches the release channel on every node
// (redislock's Watch, through each node's one shared pub/sub connection),
// and returns once a quorum confirmed; a release publishes on every node
// where a TryAcquire found the lock held, and the first message from any
// node wakes the waiter.
//
// # Which backend
//
// The usual comparison of the three designs, with dlock's behaviour:
//
//	                  single Redis         Redlock (5 nodes)       etcd / ZooKeeper
//	acquire+release   2 round trips        3 round trips, each in  2 requests, each a
//	                                       parallel to all nodes   consensus write (disk
//	                                       (see below)             fsync on a quorum)
//	survives          nothing (Sentinel/   any 2 of 5 nodes        a minority of members
//	                  Cluster failover
//	                  may lose a lock)
//	consistency       async replication:   quorum + clocks: needs  consensus: no clock
//	                  AP                   the TTL/drift bounds    assumption for order
//	fencing           server TIME in µs    max over a quorum,      revision / zxid
//	                                       agreed (above)
//	dead holder       TTL expiry           TTL expiry              lease / session expiry
//	fair (FIFO)       yes (queue)          no                      yes (queue)
//	reentrant         WithOwner            WithOwner               WithOwner
//	operations        one server           five independent        a 3- or 5-member
//	                                       servers                 cluster
//
// Prefer a single Redis (package redislock) when a lost lock is an
// inconvenience, not a bug (duplicate-submit guards, cache rebuilds): it
// is the fastest. Prefer Redlock when you already run Redis, cannot afford
// to lose locks to a failover, and can run independent servers; pair it
// with fence checks. Prefer etcd or ZooKeeper when ordering must not rest
// on clocks or TTLs at all (financial transfers, leader election), or when
// you need fair queues; they cost a consensus write per acquisition.
//
// Measured (BenchmarkInterleaved in this package: one Redlock(5) and one
// single-node Acquire + Release through dlock.Client per iteration,
// alternating, go test -bench Interleaved -count 3; the range over three
// runs on the project's shared 2-core test machine at load average 25,
// other jobs running):
//
//	network between client and nodes   redislock      Redlock(5)     ratio
//	none (loopback)                    128–205 µs     0.80–1.07 ms   5.2–6.2×
//	2 ms round trip (delaying proxy)   5.1–6.9 ms     6.5–8.4 ms     1.22–1.56×
//	10 ms round trip (delaying proxy)  21.7–22.4 ms   26.6–32.3 ms   1.19–1.45×
//
// Over loopback the client's and the servers' work, five times
// redislock's on two cores, dominates. With a network, the nodes agreeing
// on the floor make it two parallel round trips against two; the rest is
// the wait for the slowest of five nodes instead of one (before the floor,
// with a write-back round trip on every acquisition: 1.63–1.70× at 10 ms).
//
// Against go-redsync's Redlock over the same five loopback nodes (per node
// and cycle one SET NX and one compare-and-delete script, 4 server
// commands, no fence), the gap is the nodes' work, not the round trips
// (two in parallel for both). A fence needs a script on both sides: the
// acquire must issue a fence above the node's clock and above a tombstone,
// which a plain SET NX cannot compare, and the release must check the
// token and fence and leave the tombstone. So each node runs two scripts
// per cycle where redsync's runs one, 6 commands where it runs 4, and on
// Redis 7.0 a script costs about 2 µs of server time before it does
// anything (an EVALSHA that runs one GET: 1.7–2.0 µs, the GET alone 0.1
// µs; see redislock, Scripts and cost). Measured on a shared 2-core
// machine (five runs of the bench's S1 at load 3–7, each alternating with
// the previous code): 0.72–0.90×, median 0.80× redsync(5)'s cycles per
// second, and 30.05–30.07 server commands per cycle (the previous code:
// 0.61–0.78×, median 0.75×, 35.04–35.08; the excess over 30: a TIME every
// few hundred cycles, see redislock, Fencing, and nodes that answer late:
// a grant given back, an acquire that finds a release still on its way).
// Per cycle the five servers spend 1.3–1.7× the CPU time they spend for
// redsync, and the client 1.0–1.3× redsync's (a loop alternating the two,
// seven runs). What narrowed the gap: no second SET on a tombstone (35 →
// 30 commands), scripts whose common case creates none of lib.lua's
// functions, one deadline context per fan-out instead of one timer per
// node, and fan-out workers that keep their stacks and exit after 50ms
// idle (a new goroutine per node call grew its stack to go-redis' depth
// every time: about a tenth of this process's CPU in that loop). The
// bench module's fenced floor on five nodes (the fenced floor's two
// scripts on every node at once, held on three grants, no agreement on
// one fence) is the least a fenced Redlock does: in three S1 runs it
// made 0.82×, 0.96× and 1.11× redsync(5), and this package 0.98×, 0.97×
// and 0.82× it (docs/BENCHMARKS.md, docs/bench/redis-floors.md). The
// project-wide comparison with etcd, ZooKeeper and peer libraries is in
// docs/BENCHMARKS.md.
package redlock
