// Package redislock is the Redis backend of dlock: locks on a single Redis
// server, a Sentinel-managed primary (redis.NewFailoverClient) or a Redis
// Cluster, through any go-redis v9 client (see Client).
//
//	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379"})
//	c := dlock.New(redislock.New(rdb), dlock.WithTTL(10*time.Second))
//	defer c.Close()
//
// The Backend does one round trip per operation and holds no policy: the
// dlock.Client waits, renews and reports lost leases. Redis 7.0 or later
// is required (SET ... NX GET, PEXPIRE ... GT, GETDEL).
//
// # Keys
//
// A lock on KEY uses these names, which share the Redis Cluster hash tag
// {KEY}, so they live in one slot and the scripts may touch them together:
//
//	dlock:{KEY}           the lock: one string (below) whose TTL is the
//	                      lease's deadline
//	dlock:{KEY}:q         the queue (only while someone waits): a sorted
//	                      set of waiters by arrival (server µs)
//	dlock:{KEY}:w:MEMBER  one waiter's heartbeat: its deadline (server ms),
//	                      expiring at that deadline
//	dlock:{KEY}:rel       the release channel, PUBLISHed to when a lock that
//	                      a TryAcquire found held is freed (Watch)
//	dlock:wake:ID         a Backend's wake channel (ID: 26 random
//	                      characters, one per Backend): a release that hands
//	                      the lock to one of this Backend's waiters
//	                      PUBLISHes here
//	dlock:{KEY}:h         permit or read holds (only while there are some):
//	                      a sorted set of FENCE:TOKEN by deadline (server ms)
//	dlock:{KEY}:x         writers' claims (only while readers hold and a
//	                      writer retries): a sorted set of tokens by deadline
//	dlock:{KEY}:pq        the permit queue (only while someone waits for a
//	                      permit): as the queue, same heartbeats
//	dlock:{KEY}:v         an elected leader's value: FENCE:VALUE, expiring
//	                      with the lock
//
// The lock's value is "FENCE:COUNT:FLAGS:AHEAD:TOKEN": the grant's fence,
// the hold count, flags (w: a TryAcquire found it held; q: waiters may be
// queued; c: handed to a waiter, not yet confirmed), a bound in ms of how
// far the fence ran ahead of the server clock at the grant (normally 0:
// it did not), and the owner token. A COUNT of 0 is a tombstone: a free
// lock whose next fence must exceed FENCE (see Fencing). The prefix "dlock:" is set with WithPrefix. A key
// that starts with '}' or '\' gets a leading '\' inside the braces (an
// empty tag would split the names over several slots). Backend.LockName
// returns the lock's name.
//
// # Scripts and cost
//
// Each operation is one Lua script, in the .lua files of this package
// (embedded with go:embed; lib.lua and queue_lib.lua hold the functions
// several share and are included where a script needs them: after the
// common cases, which acquire.lua and release.lua run inline, so that they
// do not pay for creating the functions, about 1 µs of server time per
// call), run with EVALSHA and, after NOSCRIPT, with the source. Every
// redis.call inside a script costs 1–2 µs of server time on Redis 7.0 (3–5
// µs for the queue's calls on a shared 2-core machine), so the common
// cases make the fewest calls the guarantees allow. The numbers they
// write are formatted with string.format('%d'), an integer conversion:
// '%.0f', Lua's tostring and a number passed to redis.call (%.17g in
// Redis 7.0) each cost the server a float conversion (in a loop inside
// one script, 0.68 µs for '%.0f' against 0.20 µs for '%d'). Measured per
// EVALSHA with INFO commandstats (15 alternating rounds of 2,000 calls,
// medians), the change took the wait behind a holder from 52.5 to 44.0
// µs, a release to a waiter from 44.1 to 41.2 µs and an acquire of a free
// lock from 22.5 to 20.6 µs. Server commands per operation, counted by
// INFO commandstats (EVALSHA included):
//
//	uncontended acquire       3  EVALSHA, TIME, SET NX PX GET
//	  expecting a tombstone   3  EVALSHA, GET, SET PX (package redlock)
//	uncontended release       3  EVALSHA, GET, DEL (or SET PXAT: a
//	                             tombstone, when the fence ran ahead)
//	refresh                   3  EVALSHA, GET, PEXPIRE GT
//	wait behind a holder      6  EVALSHA, GET, TIME, ZADD NX, SET (heartbeat),
//	                             PEXPIRE (queue); +1 SET to flag the lock
//	release to a waiter       7  EVALSHA, GET, TIME, ZPOPMIN, GETDEL
//	                             (heartbeat), SET (lock), PUBLISH
//
// so an uncontended acquire+release costs 6 (the earlier layout, a hash
// and a permanent fence counter, cost 9) and a contended acquisition
// (wait, hand-off) 13–14. Measured on Redis 7.0.15, 2 shared cores, load
// average 1–6 (docs/BENCHMARKS.md and docs/bench/redis-layout.md):
//
//	BenchmarkFenceCost        these scripts alone (×fenced) 0.91× the raw
//	                          SET NX PX loop; the earlier fence 0.86×
//	S1, one goroutine         6.00 server commands per cycle; the same
//	                          scripts alone 0.98× the raw floor; through
//	                          dlock.Client 0.67–1.31× the floor, median
//	                          0.97× over five bench runs at load 3–7
//	                          (scripts that created lib.lua's functions
//	                          on every call: median 0.77×, 0.59–1.09×,
//	                          in runs alternating with them); in the
//	                          latest full run 1.02× the fenced floor
//	                          (0.92× when a reader goroutine took every
//	                          reply)
//	S2, 32 goroutines         1.10× rueidislock on the Backend's own
//	                          connection (0.88× through the go-redis pool
//	                          in the run before); later full runs 0.84×
//	                          and 0.75× (load 1.5–2; each library's S2
//	                          figure moves by up to 1.9× between runs),
//	                          runs of S2 alone 1.03× (median of five) and
//	                          1.04× (seven on a quiet machine, every run
//	                          above 1.0×); the full run after the integer
//	                          formatting 1.01× (0.82–1.19× run by run)
//	S3, 16 clients, one key   default options: 3,422 hand-offs/s, 2.01×
//	                          rueidislock in the full run after the
//	                          integer formatting (1.59–2.26× run by run;
//	                          FIFO 2.10×); 1.54–2.03× over earlier runs,
//	                          Jain 1.000, 2.01 requests and 13.0 server
//	                          commands per acquisition; 0.80–0.89× the
//	                          least a queue with one PUBLISH per release
//	                          does (the bench's hand-off floor, 2.18–2.41×
//	                          rueidislock), 0.88× in that run: the rest is
//	                          the scripts' extra calls and Lua work (per
//	                          acquisition, the server's EVALSHA time was
//	                          107 µs against the floor's 40 µs in one S3
//	                          run) and the clients' work on the
//	                          hand-off's path
//	100,000 held locks        one key each, about 240 bytes of used_memory
//	a Redlock node's cycle    BenchmarkFloorCycle (acquire with a fence
//	                          floor, release): 6.00 commands per cycle
//	                          taking one key again (its tombstone
//	                          expected) and on new keys alike
//
// Redis 7 functions (FCALL) would not pay: measured with redis-benchmark
// (100,000 calls, three runs, load 5), a function returning a GET costs
// 1.5–1.8 µs of server time per call, the same script run with EVALSHA
// 1.7–2.0 µs (a plain GET 0.1 µs), and a library would have to be loaded
// on every server before the first lock.
//
// What keeps the Client's uncontended cycle below the raw floor is the
// fence, not the transport: on the Backend's own connection a call runs on
// its caller's goroutine whether or not its context can end (see
// Contexts; BenchmarkBackendCycle, alternating with the binary before
// that change, three runs: 81–110 µs per cycle with a context that can
// end against 139–218 µs when such a call ran on a helper goroutine, and
// 87–97 µs against 109–196 µs with one that cannot), and
// BenchmarkInterleaved puts the Client's cycle at 0.90–0.97× the fenced
// floor's ops/s. On a quiet machine the raw floor itself is out of reach: an EVALSHA costs the server about 4 µs before its first
// redis.call (INFO commandstats on Redis 7.0.15: 5.1 µs per fenced
// script against 0.9 µs for a SET), and a fenced cycle needs two scripts,
// so in the bench module's S1 on a quiet machine the fenced floor
// (internal/fencedfloor) makes 0.79× the raw floor's cycles and this
// package 0.90× the fenced floor (docs/bench/redis-kinds.md). With the
// client and every server on one CPU, where each cycle is CPU-bound, the
// fenced floor made 0.76–0.78× the raw floor and 0.83–0.84×
// bsm/redislock, and this package 0.89–0.94× the fenced floor
// (docs/bench/one-cpu.md). There the Client's and this package's own
// work is about a fifth of the client's CPU per cycle; go-redis sending
// the two scripts is most of the rest.
//
//   - acquire.lua takes a free lock (SET NX PX GET, count 1, fence: the
//     server time) or one that holds a tombstone (fence above it, see
//     Fencing), re-enters one the token holds when the request is
//     reentrant (count + 1, same fence), confirms a hand-off, or reports
//     the holder's PTTL;
//   - release.lua compares the token (and the grant's fence), then
//     decrements the count, or hands the lock to the first live waiter,
//     or deletes it (or leaves a tombstone, see Fencing);
//   - refresh.lua compares the token and fence and extends the deadline;
//     RefreshMany sends one refresh per lease in one write or pipeline
//     (one round trip per server; a ClusterClient splits it by node);
//   - queue.lua is one step of a wait (join, heartbeat, take), leave.lua
//     takes a waiter that gives up out of the queue;
//   - acquire_all.lua takes several locks of one slot, all or none;
//   - inspect.lua reads a lock, or deletes it for ForceRelease;
//   - agree.lua gives a grant another token and fence (Adopt, for redlock);
//   - kind_acquire.lua, kind_release.lua and kind_refresh.lua do the same
//     for a permit or a read hold, kind_claim.lua records or withdraws a
//     waiting writer's claim, kind_inspect.lua reads or removes the holds,
//     kind_queue.lua is one step of a permit wait and kind_leave.lua takes
//     a permit waiter that gives up out of its queue;
//     kind_value.lua stores a leader's value, which refresh.lua extends
//     with its lock (see Permits and read holds, and Leader election).
//
// Reply codes are named in replies.go (and kind.go).
//
// # Pipelining
//
// Redis spends more on reading a command from a socket and writing its
// reply than on a short script, so a Backend sends its goroutines'
// concurrent script calls together. On a *redis.Client of one server it
// does so on a connection of its own (conn.go), dialled on first use with
// the client's dialer (TLS included), credentials, database and client
// name: a call is written as soon as no other write is under way, together
// with every call queued meanwhile, without waiting for the replies of
// earlier ones (a writer who finds calls out yields once first, so that
// goroutines about to call join its write). Replies are read by one
// goroutine at a time, which hands each to its call in order: a caller who
// finds nobody reading reads until its own reply comes, then leaves the
// reading to a goroutine that reads while calls are out. The server always
// has commands to read, as with rueidis, and a lone call costs one write
// and one read on its caller's goroutine, as on a go-redis connection. An
// idle connection is read by nobody: before a call goes on it, a peek at
// the socket (Unix) tells whether the server closed it meanwhile. The
// connection is dialled again after a failure (the calls on it fail with
// the error: their outcome is unknown, as with any lost reply). A dial runs
// on the first caller's goroutine, bounded by its context and the client's
// DialTimeout, while later callers wait for it; when that caller's context
// ends first it fails with its context's error and the next waiter dials,
// so one short deadline does not fail calls that have time left. The client's
// ReadTimeout and WriteTimeout bound its reads and writes while calls wait
// for replies; Close, or the Backend becoming garbage, closes it. go-redis'
// hooks (DialHook included) and limiters do not see these commands or
// this connection; Inspect, ForceRelease, the give-backs of abandoned
// grants and the pub/sub subscription still use the client. RefreshMany
// writes all its refreshes at once, one round trip, on a second connection
// of the Backend's own, dialled at the first renewal: a batch of 100,000
// refreshes takes the server about a second, and on the first connection
// every call queued behind it would wait that long (in the bench module's
// S5 a Redlock fill then failed 7,463 of 100,000 acquisitions at their
// node timeout).
//
// A ClusterClient, a Sentinel failover client (go-redis moves its
// connections at a fail-over), a client with an OnConnect hook or a
// streaming credentials provider, WithReplicas (WAIT must follow the
// script on its connection) and WithClientPool use the client's pool
// instead (batch.go): while fewer than WithPipelines calls (default 2) are
// in flight, a call is sent at once, alone, on its caller's goroutine; the
// calls made while the slots are taken wait, and when a slot frees, the
// goroutine of the first of them sends them all (at most 64) in one
// pipeline and hands every call its reply. A batch is sent without its
// callers' cancellation or deadlines, bounded by the client's timeouts.
//
// Every call is still bounded by its own context (see Contexts). On the
// Backend's connection a call whose context ends returns at once, and its
// reply, when it comes, is read by the next reader and handed to the
// call's give-back (a grant nobody will use is released). Through the pool,
// on a helper goroutine (a context that can be cancelled, without
// ContextTimeoutEnabled) the caller returns at once and a grant that comes
// later is given back too; on the caller's goroutine (ContextTimeoutEnabled
// with a deadline) a call not yet taken into a batch is never sent, while
// one already taken returns with its reply when the batch's replies come
// (within the client's ReadTimeout).
//
// Measured with BenchmarkParallel (S2 on one Client: 32 goroutines on 32
// keys, Redis 7.0.15, 2 cores, three runs each, load 0.4–1.2): 26.8, 41.9
// and 46.2 µs per acquire + release on the Backend's connection against
// 39.8, 55.6 and 66.2 µs through the pool with two pipeline slots, run by
// run; per cycle the client spent 21–26 µs of CPU against 30–37 µs and
// the server 16–20 µs against 22–28 µs (one write carries about seven
// calls, one read about twenty replies). A lone goroutine reads its own
// reply: BenchmarkInterleaved put the pool path at 0.93–1.01× the ops/s
// of the Backend's connection, and the fenced floor's loop at 1.03–1.12×
// (when a reader goroutine took every reply: 1.15–1.16× and 1.25–1.28×,
// three runs each, alternating). Through
// the pool, two slots beat one and three or more; its gap to rueidis was
// in how the round trips overlap (a go-redis pipeline holds its connection
// until every reply has come), not in the work.
//
// # Lease model
//
// Deadlines never move back: a grant sets D = now + TTL; a re-entry, a
// Refresh, a RefreshMany entry and a hand-off's confirmation set
// D = max(D, now + TTL) (PEXPIRE ... GT), so a renewal carrying an older,
// shorter TTL, a re-entry or a Refresh with a shorter TTL never shorten
// the lock. Refresh and Release act only on the grant they came from: they
// compare the token and, when the request carries one, the fence; on a
// mismatch nothing changes and the error matches dlock.ErrNotHeld. Release
// decrements the count; at 0 the lock goes to the first live waiter or is
// deleted. A TryAcquire that is not reentrant is never granted a lock its
// token holds already (holds of one Client are counted by the Client;
// server-side counts are for Clients that share a dlock.WithOwner id). A
// reentrant attempt whose reply was lost may have raised the count: the
// leftover hold has no renewal of its own, so once the Clients release
// their holds the lock is free no later than its deadline. An attempt
// that is given up (its context ended) releases only its own grant (by
// token and the fence its reply carried), never an earlier grant of the
// same token; a waiter that leaves passes on only a lock handed to it and
// not yet confirmed.
//
// go-redis resends a command whose connection broke or timed out after it
// was written (Options.MaxRetries, 3 by default), so a script may run
// twice. The lock scripts tolerate a repeat for one Client's holds: a repeated
// grant is refused (the token holds the lock), a repeated Refresh sets the
// same deadline, a repeated Release finds the lock gone or another grant's
// (and reports dlock.ErrNotHeld, though the first run released it).
// Only an owner id shared by several Clients is exposed: a repeated
// Release gives up two of its holds, another Client's among them. Clients
// that share a dlock.WithOwner id across processes should set MaxRetries
// to -1 on their go-redis client.
//
// # Fencing
//
// A fresh grant's fence is the server time in µs (TIME inside the script),
// raised above a tombstone's fence when there is one, and above the floor
// a caller passes in Request.Fence (package redlock). It is stored in the
// lock's value; there is no counter key. Fences of one key strictly
// increase across release, expiry, DEL of every key and a restart without
// persistence (or a failover to a replica that lost the lock) because:
// a grant on a free key issues at least the server time, a grant on a
// tombstone more than the tombstone's fence; two grants of one key are
// separated by at least one other script (a release, a hand-off) or by an
// expiry (≥ 1 ms), and a script takes more than a microsecond, so a fence
// that did not run ahead of the clock is below the server time of any
// later grant; a fence that ran ahead of
// the clock at its grant (a redlock floor; AHEAD not 0) is carried over
// its release by a tombstone that lives until the server clock passes it
// (SET ... PXAT FENCE/1000 rounded down: Redis expires a key only once
// its clock in ms is past that, so while the tombstone is gone the clock
// in µs is past FENCE), and a lock lives longer than its fence runs
// ahead (a floor runs ahead by milliseconds, a lease lasts its TTL). The
// assumption: the server clock (after a failover, the new primary's)
// never steps back between two grants of a key, and a fence runs ahead of
// it by less than the lease TTL; NTP slewing is harmless, a backward step
// of the clock by s can reissue fences of the last s. µs since 1970 stay
// exact in Lua's doubles (below 2^53) until the year 2255.
//
// A grant on a tombstone needs no TIME: the tombstone's fence is above
// every earlier fence of the key, so the grant issues max(floor,
// tombstone + 1), and bounds AHEAD by the tombstone's AHEAD plus the
// milliseconds it adds (the tombstone's fence ran ahead by less than its
// AHEAD when it was granted, and the clock has not gone back since); a
// bound grown past a second is computed from TIME instead. Package
// redlock's floors run ahead of the clock by a few ms, so a lock it takes
// again within them finds its own tombstone: the Backend remembers, in a
// table of 64 slots by hash, locks it granted with a floor and their
// fences, and until the
// server clock (as learnt from the last TIME a script reported) passes
// such a fence, acquire.lua reads the lock first (GET, then one SET of a
// tombstone, or TIME and SET of a free lock) instead of SET NX GET, which
// finds the tombstone and needs a second SET. A wrong guess costs one
// redis.call, never a wrong fence; locks taken without a floor (every
// lock of a single server) are never guessed.
//
// # Nothing left behind
//
// Every key expires: the lock with the lease (a tombstone when the server
// clock passes its fence, normally none), a heartbeat at its waiter's
// deadline (the waiter TTL), the queues twice the waiter TTL after the
// last waiter's step; the holds and claims of permits and read holds at
// the last deadline they carry, a leader's value with its lock (see
// below). So no key of a lock outlives its last lease by more than
// max(lease TTL, how far its fence ran ahead of the server clock, 2 ×
// waiter TTL): 0.8 s after the lease with the defaults, and
// in every case within the lease TTL plus 60 s while the clocks of a
// Redlock's nodes and clients are within 60 s of one another. The earlier
// layout's permanent counters (PREFIX{KEY}:fence) are not read or written;
// delete them when no client of an earlier version runs.
//
// # Permits and read holds
//
// A semaphore's permits (dlock.KindPermit) and a read-write lock's read
// holds (dlock.KindRead) are kept in the same lock key, so the lock
// scripts need no change to respect them: while a key has such holds its
// lock holds a marker, a lock value with an empty token (no owner token is
// empty, so a lock request sees the key held by someone else and waits,
// and a Release or Refresh of a lock finds nothing of its own), flag p or
// r, COUNT the semaphore's number of permits (1 for read holds) and FENCE
// the first hold's fence (raised when a hold's fence runs ahead of the
// clock). The holds themselves are the sorted set dlock:{KEY}:h: member
// FENCE:TOKEN, score the hold's deadline in server ms. Each hold is a
// lease of its own: its fence is the server time in µs, as a lock's (so
// fences strictly increase per key across permits, read holds and locks,
// and a writer's fence is above every read hold's before it); Refresh and
// RefreshMany set its deadline to max(deadline, now + TTL) (ZADD XX GT)
// and extend the marker and the set (PEXPIRE GT); Release and Refresh
// compare the token and the fence. A new marker starts a new set: the
// first hold finds, with PEXPIRE NX, a set an earlier marker left (every
// set gets its TTL when it is created) and deletes it, so holds whose
// marker was deleted behind their backs (an eviction, a stray DEL) are
// void and count no more. A member whose deadline passed is
// dead: every acquisition drops the dead ones first (ZREMRANGEBYSCORE), so
// a holder that dies gives its permit back at its deadline, never later,
// without a release. A read hold's release sets the marker's expiry to the
// longest live hold's deadline, so dead readers keep a writer out no
// longer than their own TTL.
//
// A permit acquisition that names another number of permits than the
// live holders' fails with an error matching dlock.ErrPermits; a permit
// on a key held as a lock or by read holds (and a read hold on a
// semaphore's key) with one matching dlock.ErrWrongType; nothing is
// changed then. A lock request on a semaphore's key waits until no
// permit is held. Holds are not reentrant, and a token is not checked for
// a hold it has already (the dlock.Client gives every hold its own
// token).
//
// Writers first. A KindLock request with Request.Waiting that finds
// readers leaves a claim in dlock:{KEY}:x for its TTL (flag x on the
// marker; the claim that sets the flag starts a new set, so claims left
// by writers of an earlier marker never count), withdrawn by a Release
// with Waiting and no fence (or when its Wait gives up); a writer queued
// in the lock's queue (flag q) counts too.
// While a live claim or a live queued writer exists, no new read hold is
// granted; readers that already hold go on, and when the last one leaves
// the key goes to the first queued writer (a hand-off, as a lock's
// release does). Readers that were kept out are notified when the writer
// releases or gives up.
//
// Permit waiters queue, as lock waiters do, in a queue of their own,
// dlock:{KEY}:pq, with the same heartbeats (kind_queue.lua is one step:
// join, heartbeat, confirm), with or without dlock.WithFIFO: a permit's
// release (marker flag s) hands the permit to the first live waiter, as a
// hold with a new fence reserved for the waiter TTL, and PUBLISHes on that
// waiter's Backend's wake channel only; the waiter holds it from that
// message on and confirms it with its first renewal (or its next step).
// So permits go in arrival order and one release wakes one waiter. A
// waiter first in line whose heartbeat finds a permit free (holders that
// expired) takes it with kind_acquire.lua; a waiter that gives up leaves
// the queue and releases a permit just handed to it, which passes it on.
// As for locks, a TryAcquire does not read the queue: a permit freed by an
// expiry may go to a TryAcquire before the first waiter's next heartbeat.
// Measured (TestKindPermitContention: 8 Clients, 2 permits, 320
// acquisitions): 22.1 server commands per permit; waiting by notification
// instead (every waiter retries after every release) cost 36.4.
//
// Read holds are waited for by notification: Wait watches the key's
// release channel and tries again after each release message (a read
// hold's last release, a writer's release or withdrawal, each PUBLISHed
// only when an attempt found the key held: flag w), and at the latest
// when the hold in the way expires (every waiter TTL when that is
// unknown). Readers exclude no one but writers, so every reader waiting on
// the key may enter after a writer's release: one message wakes them all
// (one subscription per Backend), and their arrival order does not
// matter; with dlock.WithFIFO they wait the same way, behind every writer
// that waits (writers first).
//
// Inspect reports such a key with Info.Kind, Info.Permits and one
// Info.Hold per live hold (a second script after inspect.lua);
// Info.Waiters counts the writers in the lock's queue and the permit
// waiters (read waiters wait by notification and are not counted).
// ForceRelease removes every hold at once; their holders learn it at
// their next renewal.
//
// Server commands (INFO commandstats, EVALSHA included; TestKindCommands):
//
//	permit or read hold, first on its key    acquire 5, release 5
//	permit next to other holders             acquire 8, release 5
//	read hold next to other readers          acquire 8, release 7
//	refresh                                  7
//
// so an uncontended acquire+release costs 10 server commands for a
// permit or a read hold alone on its key (a lock: 6; the raw sorted-set
// semaphore without leases or fences, BenchmarkRawSemaphore: 7), 13 for a
// permit and 15 for a read hold among others. The first hold (TIME, SET
// NX PX GET, ZADD, PEXPIRE NX) and the release of the last one (GET,
// TIME, ZRANGE BYSCORE LIMIT 0 2, DEL) run before the scripts include
// lib.lua and kind_lib.lua: creating their functions costs about 1 µs of
// server time per call. The release's ZRANGE of the first two live holds
// tells at once whether the hold is live and whether another one is (the
// earlier script spent a ZSCORE and a ZCOUNT on it).
// Measured (2 shared cores, load average 10–13, medians of 4 runs
// alternating with the earlier scripts): redis-server CPU per permit cycle
// (BenchmarkBackendPermitCycle) 50 µs against the raw semaphore's 34 µs
// (BenchmarkRawSemaphore; the earlier scripts: 59 µs), much of the rest
// being the release, a script where the raw semaphore's is one ZREM;
// BenchmarkPermitInterleaved: the Backend 0.83× the raw semaphore (the
// earlier scripts 0.76×), through dlock.Client 0.77× (0.71×). A permit's
// cycle through the Client now costs what a lock's does (bench K1 and S1,
// same run: p50 65–74 µs against 59–73 µs). Nothing is left behind: the last
// release deletes the marker, the holds and the claims (DEL of the
// three); when holders die, the marker and the holds expire at the last
// deadline; claims expire at theirs, the permit queue twice the waiter
// TTL after its last waiter's step.
//
// # Leader election
//
// The Backend is a dlock.Proclaimer: a KindLock grant whose request
// carries a Value (dlock.Election.Campaign) stores it in dlock:{KEY}:v as
// FENCE:VALUE right after the grant (a second round trip), with the
// lock's remaining TTL; SetValue replaces it while the token's grant
// still holds the lock; renewals of a request with a Value extend it with
// the lock (refresh.lua, given the value's key). Inspect reports it in Info.Value when
// its fence is the holder's (a GET in the inspection's pipeline: one
// round trip), so a value left by an earlier leader is never reported for
// a later one. After a Proclaim the Client's renewals carry the new value.
// The leader's term is its lock's fence. The Backend is
// not a dlock.Notifier: dlock.Election.Observe reads the leader at its
// polling interval.
//
// # Rolling deploy
//
// A lock written by an earlier version of this package (a hash with an
// owner field) is reported held to this version: TryAcquire returns its
// PTTL, waiters queue behind it and re-check with every heartbeat, and
// Release, Refresh and ForceRelease leave it alone. An earlier version
// finds this version's string where it expects a hash and fails with a
// wrong-type error, granting nothing. So no lock is granted twice during
// a rolling deploy; the fences of the new grants are the server time,
// above the earlier ones unless their counter ran ahead of the clock.
// Clients of the previous string layout share this one (same value, same
// meaning of each field; AHEAD stays a bound in ms, which their release
// uses as the tombstone's TTL, while this version's tombstone lives until
// the clock passes the fence).
//
// # Waiting
//
// The Backend is a dlock.Waiter and not a dlock.Notifier: the Client
// waits for every Acquire in the lock's server-side queue, with or without
// dlock.WithFIFO (permits in a queue of their own, read holds by
// notification: see Permits and read holds). A release hands the lock, inside
// release.lua, to the first live waiter (new fence, reserved for it for
// the waiter TTL) and
// PUBLISHes on that waiter's Backend's wake channel only: one release wakes
// one waiter, which holds the lock from that message on (it carries the
// fence) and confirms it with its lease's first renewal or release
// (without auto-renew: before Acquire returns); until then the lease's
// Expires is the reservation's end. A contended acquisition costs two
// requests (join, release) plus a heartbeat per WithWaiterTTL/4 of
// waiting. Waiters heartbeat every WithWaiterTTL/4 (100ms by default);
// a release skips waiters whose heartbeat expired, and a lock handed to a
// waiter that died is free again after the waiter TTL, so a dead waiter
// delays the others by at most the waiter TTL plus a quarter of it. A
// live waiter that is late keeps its place: its next heartbeat rejoins at
// its arrival. Every Backend on the same locks should use the same waiter
// TTL, since the releasing Backend sets the reservation's length; below
// 10ms, heartbeats would load the server more than the waiting they
// replace. A waiter whose context ends leaves the queue at once, passing
// on a lock it was just handed.
//
// Why a queue rather than a targeted notification: a notification, even
// one per release, wakes a waiter that then needs a round trip to try,
// while the releaser (which loops) tries at once and wins, so the lock
// rarely changes hands. Polling peers show it: they hand the lock over in
// about 1 of 10 acquisitions (S3). Measured in S3 (16 clients, one key,
// hold 100 µs): the earlier broadcast notification mode made 1,768
// hand-offs/s with 15.6 requests and 60 server commands per acquisition;
// the queue makes 3,701 with 2.0 and 13.0, Jain's index 1.000. A targeted
// notification was not built: it keeps the releaser's advantage and adds
// the bookkeeping of who waits, which is what the queue already is.
// Uncontended locks pay nothing for the queue: it is touched only when
// someone waits (flag q).
//
// TryAcquire does not read the queue: a lock that freed itself without a
// release (an expiry, a DEL) while waiters are queued may be taken by a
// TryAcquire before the first waiter's next heartbeat, which then marks
// the new holder's lock so that its release hands over to the queue.
// Releases never overtake the queue.
//
// Watch (used by package redlock, whose nodes have no queue) delivers
// release messages over ONE pub/sub connection per Backend shared by all
// watches; only releases of locks that a TryAcquire found held publish.
//
// In a Cluster the channels are ordinary ones (PUBLISH reaches every node),
// so one connection hears every release. A *redis.Ring is refused for that
// reason: its shards do not share messages.
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
// (sent in the same pipeline, on the same connection, as the script: WAIT
// counts the writes of its own connection only; on a Cluster, the
// primary of the lock's slot), and one that fewer than n replicas
// acknowledged in time is released and fails with ErrNotReplicated, not
// dlock.ErrNotAcquired: the lock was free, the deployment is degraded. A
// server with no replicas fails every acquisition this way, after the
// timeout. An acquisition is then only reported when n replicas have it,
// so a failover to one of them keeps the lock; with n equal to the number
// of replicas (Sentinel's usual setting), every replica the failover can
// promote has it.
//
// It stays a narrowing, not a guarantee: replication is still
// asynchronous (WAIT reports what happened, it does not make writes
// synchronous); with n below the number of replicas a failover may pick
// one that had not acknowledged; a replica that restarts without
// persistence forgets the lock (WAITAOF, which waits for the replicas'
// disks, needs Redis 7.2 and is not used); and renewals and releases are
// not confirmed, so after a failover a lease may have an older TTL than
// its holder computed, and a released lock may come back until it
// expires. Fences stay increasing across failovers whatever happens: use
// a fenced resource where overlapping holders would do harm. Every
// attempt, including one that finds the lock held and every FIFO
// heartbeat, lasts until the replicas have caught up (about a round trip)
// or until the timeout; a timeout close to the waiter TTL makes the
// waiters of a degraded deployment miss heartbeats (they keep their place,
// but may be skipped once). The timeout must be shorter than the client's
// ReadTimeout, or the reply would time out first. Queues and heartbeats
// are replicated like any write; waiters that the new primary lost rejoin
// at their arrival with their next heartbeat.
//
// # Several keys
//
// The Backend implements dlock.MultiAcquirer for dlock.Client.AcquireMany:
// keys whose locks share a Redis Cluster slot (on a single server or
// behind Sentinel: all keys) are taken in one script, all or nothing, each
// with its own fence; Groups computes the slots locally with CRC16, as
// Redis does. Keys of different slots are taken group by group in sorted
// order by the Client, so callers with overlapping key sets never
// deadlock.
//
// # Contexts
//
// Every call returns when its context ends, whatever the go-redis timeout
// settings, and a grant that arrives after the caller gave up is released
// at once (the only retry-like work a Backend does; it never sleeps). On
// the Backend's own connection the call runs on the caller's goroutine,
// which stops waiting (or reading) at the context's end and leaves the
// reply to the connection's next reader. Through the client's pool, with a
// context that can be cancelled the command runs on a helper goroutine
// that finishes within the client's ReadTimeout; with ContextTimeoutEnabled
// and a deadline it runs on the caller's goroutine and ends at the deadline
// (a grant is then not given back but expires with its TTL; see
// Pipelining for a call that waits to be batched).
package redislock
