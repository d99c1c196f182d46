// Package zklock is the ZooKeeper backend of dlock: a fair (FIFO) lock
// built from ephemeral sequential znodes, each waiter watching only its
// predecessor, with the lock node's czxid as the fencing token; and, on
// the same queues, semaphores, read-write locks and leader election.
//
//	conn, b, err := zklock.Connect([]string{"zk1:2181"}, 10*time.Second)
//	if err != nil { ... }
//	c := dlock.New(b, dlock.WithTTL(10*time.Second)) // TTL ≤ the session timeout
//	defer c.Close()                                  // also closes conn
//	err = c.Do(ctx, "order:1001", func(ctx context.Context, l *dlock.Lease) error { ... })
//	_ = conn                                         // usable for other purposes too
//
// A Backend wraps one ZooKeeper session: the *zk.Conn made by Connect (the
// Backend owns it) or passed to New (the caller owns it). Give each
// dlock.Client its own Backend; all the Client's locks share the session.
//
// # Layout
//
// The locks live under a root path (WithPath, default "/dlock"). Key k has
// a queue node root/escape(k) (a container znode, which the server removes
// some time after it empties) holding one ephemeral sequential node per
// holder or waiter:
//
//	/dlock/orders%2F1001/_c_3f0c…e1-lock-0000000007   holder (lowest sequence)
//	/dlock/orders%2F1001/_c_9a41…07-lock-0000000008   waiter, watches …07
//
// The node's data is the owner token (shown by Inspect); when it carries
// an elected leader's value (or the token starts with a zero byte), it is
// a zero byte, the token's length as a uvarint, the token and the value.
// The name follows
// the "protected" convention of Apache Curator and go-zookeeper: "_c_", a
// random 32-hex-digit guid chosen per acquisition, "-lock-", and the
// sequence ZooKeeper appends ("-read-lock-" and "-semN-lock-" for the
// other kinds of holds, see Kinds of holds). Queues are ordered by
// sequence number, so nodes of go-zookeeper's zk.Lock on the same queue
// node interoperate (they count as locks).
// zklock never deletes parent nodes; root components are created as empty
// persistent znodes on first use.
//
// Escaping: a key is any bytes, a znode name is not. escape keeps ASCII
// letters, digits and "-_.:@,=+~" and writes every other byte as "%XX"
// (upper-case hex), including "/" and "%" themselves; the names "." and
// ".." become "%2E" and "%2E%2E". The mapping is one to one and always
// yields a single valid ASCII znode name: "a/b" is the node "a%2Fb", never
// a nested path. Backend.KeyPath shows the result.
//
// # Acquiring
//
// An acquisition creates its node and lists the queue: first in the queue
// means granted; otherwise Wait sets a watch on the node just ahead and
// lists again when it fires, since the predecessor may have been a waiter
// that gave up. A waiter second in line also watches its own node; then
// the predecessor's deletion is the grant and no listing is needed (nodes
// ahead only ever leave, and had our node been deleted first, its watch
// would have fired first): the hand-off costs the holder's delete and one
// notification. A waiter third or further in line also watches the node
// before its predecessor (and its own node): when that one goes (usually
// its holder released), it lists the queue while the predecessor holds
// the lock and, finding the predecessor first, is second in line for the
// next hand-off, so that one needs no listing either. It need not list
// when those two were the only nodes ahead at its last listing: the
// predecessor heads the queue then. A release thus wakes at most two
// waiters, never a herd. TryAcquire deletes its node again when it is not
// first. A waiter whose context ends deletes its node at once, with a
// fresh context bounded by a second, and returns the context's error;
// go-zookeeper's own zk.Lock has neither contexts nor a try operation.
//
// Round trips: an uncontended acquire and release take three (create,
// list, delete), as zk.Lock's do. A waiter queued second takes five
// requests (create, list, watch, exists on its own node, delete), one
// queued third six (also a watch on the node before its predecessor),
// one queued further back seven (and a listing when that node goes, while
// the predecessor holds the lock); the watches and the exists go out
// together, pipelined in one round trip, and none of them sends anything
// between its predecessor's delete and its grant. zk.Lock takes five
// (create, list, watch, list, delete), its second listing on the path of
// every hand-off. The fence costs none: with Connect it is read off the
// wire from the create's reply (whose zxid is the new node's czxid), with
// New the create is a multi-op with an empty write to the queue node,
// whose returned Stat carries the same zxid. The watch that reports a
// held node's deletion is set 100ms into a hold (most holds are over by
// then), or at the first Refresh.
//
// Lost replies: if the connection drops after a create was sent, the node
// may or may not exist. The acquisition lists the queue once reconnected,
// after a sync (the server the session moved to may lag behind the
// create, whose zxid the client never saw), and adopts the node whose name
// carries its guid, instead of creating a
// second one and leaving the first in the queue for as long as the session
// lives (which would block every later waiter). Any node an acquisition
// cannot account for — a create or delete whose answer never came — is
// deleted by a background clean-up that retries until the node or its
// session is gone, or the Backend is closed. Close with New (the session
// outlives the Backend) gives the clean-ups still pending up to the
// session timeout to finish; with Connect, closing the session removes
// the nodes.
//
// Reentrancy (dlock.WithOwner) is local to the Backend: a reentrant
// request of the token that holds the lock through the same Backend raises
// a count kept in memory (after checking that the node still exists) and
// keeps the fence; only the last Release deletes the node. A dlock Client
// counts its own nested holds and sends the backend only an owner's first
// one, so the count exceeds one only when several Clients share a Backend.
// The same owner through another Backend, i.e. another session, queues
// like anyone else: ZooKeeper ties a lock node to one session, and a hold
// shared across sessions would end with whichever session released first.
//
// # Kinds of holds
//
// Semaphores (dlock.KindPermit) and read-write locks (dlock.KindRead
// beside the key's lock, which is the write hold) live in the key's queue
// too, after Apache Curator's InterProcessSemaphoreV2 and
// InterProcessReadWriteLock: one ephemeral sequential node per hold or
// waiter, its kind in its name:
//
//	/dlock/k/_c_3f0c…e1-lock-0000000007        a lock, or a writer
//	/dlock/k/_c_9a41…07-read-lock-0000000008   a read hold
//	/dlock/k/_c_51d2…a0-sem3-lock-0000000009   a permit of a semaphore of 3
//
// Every name ends in "lock-" and the sequence, so one queue orders them
// all, and a lock (a writer) waits for every node ahead of it, whatever
// its kind, exactly as described above. Names that say no kind (zk.Lock's)
// are locks.
//
//   - A read node is granted when no lock node is ahead of it: readers
//     share the key, a writer waits for the readers ahead of it, and
//     readers that come after a queued writer wait behind it — writer
//     preference, as in Curator: a stream of readers cannot starve a
//     writer, and readers that hold already go on. A waiting reader
//     watches the nearest lock node ahead. Its deletion is that writer's
//     release (a writer is granted only when first, so no writer is ahead
//     any more) or that writer giving up. When it was the only writer
//     ahead, the reader also watches its own node (pipelined, as a lock
//     waiter second in line does) and the deletion is its grant, with no
//     listing; otherwise it lists the queue again and is granted or
//     watches the next writer ahead. A release thus wakes the readers that
//     waited for exactly that writer, and the node behind it as for locks;
//     no one else.
//   - A permit node is granted when fewer than N nodes are ahead of it:
//     the first N nodes of the queue hold the permits, in arrival order
//     (N ≤ 65536, else dlock.ErrInvalidOption).
//     The first waiter (N nodes ahead) watches all N, so any release wakes
//     it, and only it. A waiter further back watches its predecessor only.
//     A permit granted with nodes behind it rewrites its node's data,
//     unchanged, in the background (the signal): the waiter behind, now
//     perhaps first in line, lists the queue and watches the holders. A
//     waiter that finds its predecessor's data version above 0 when
//     setting its watch lists at once (the signal came first); a holder's
//     data change does not wake the first waiter (it watches again). The
//     signal is written whenever nodes are behind at the grant, since the
//     waiter behind may have seen this node waiting and be watching it,
//     whatever happened since. Without a signal, each waiter would have
//     to watch the N nodes just ahead of it, and a release would wake up
//     to N waiters.
//   - Disagreement: N is in every permit node's name, so the listing each
//     acquisition makes anyway shows the holders' N. A permit request
//     whose nodes ahead carry another N fails with an error matching
//     dlock.ErrPermits; kinds that do not mix
//     (a permit behind a lock or read node, a lock or read hold behind a
//     permit) fail with dlock.ErrWrongType. Only the nodes ahead are
//     checked, so the first comers keep their holds; the refused request
//     deletes its node.
//   - Each hold is its node: a lease bound to the session exactly as a
//     lock (all of The lease model and Lost leases below applies: Refresh,
//     the loss watch, the clean-up of holds given up); Release deletes it,
//     and a dead holder's node goes with its session, its permit with it.
//     Permit and read holds are not reentrant: a request of a token that
//     already has a permit or read hold of the key through the Backend,
//     or a lock of the key when the request is of another kind, is not
//     granted.
//   - Fences: the node's czxid, as for locks. A writer is granted only
//     when first in the queue, so every hold granted before it, readers'
//     included, has a node created before its own, and a lower czxid; a
//     reader that comes after a writer waits for it and has a higher one.
//     Permits are granted in sequence order, so their fences increase in
//     the order the permits are granted.
//   - Round trips: an uncontended permit or read hold takes three (create,
//     list, delete), as a lock (TestRoundTrips). A waiting one adds its
//     watches (one for a reader and for a permit waiter behind the first,
//     N for the first, pipelined; a reader behind a single writer also
//     watches its own node) and a listing per wake-up (none for that
//     reader's grant); a permit granted with nodes behind it also writes
//     its signal, after the grant. A permit of a semaphore of one permit
//     handed over by its holder's release takes five requests (create,
//     list, watch, list, delete), and so does a read hold after a writer's
//     release (create, list, two watches, delete) (TestKindHandoff).
//   - Inspect lists the holders in Info.Holds: the read nodes ahead of the
//     first lock node, or the first N permit nodes. ForceRelease deletes
//     them all.
//
// Leader election (dlock.Proclaimer): the leadership is the key's lock,
// its term the lock node's czxid, and the leader's value is kept in the
// node's data from the create on; SetValue rewrites it (one write, which
// lands only while the node of that grant exists). The write changes the
// node, which ends the loss watch on it until the next Refresh sets it
// again, and wakes the campaigner behind, which lists the queue once.
// Losers read the leader with Inspect.
//
// # The lease model
//
// A zklock hold is bound to its session, not to a TTL, and the dlock
// Client's lease model maps onto it as follows.
//
//   - Deadline. The server keeps a held node until its session expires,
//     which is never earlier than the session timeout T after the session's
//     last contact. Every acquisition and Refresh is such a contact, made
//     after the Client's invoke time, so the server's deadline is at least
//     invoke + T ≥ invoke + TTL ≥ Expires whenever TTL ≤ T (checked on
//     every acquisition and Refresh). Nothing moves that deadline back: a
//     re-entry or a Refresh with a shorter TTL, or a late renewal, only
//     adds contacts; the TTL a request carries changes nothing on the
//     server.
//   - Refresh and Release act on the grant they name: the token and, when
//     the request carries one, the fence (the node's czxid) must match the
//     hold this Backend records, else they return an error matching
//     dlock.ErrNotHeld and change nothing.
//   - Re-entry is counted in memory only after the node was found to
//     exist, and the grant is returned at once: there is no lost reply
//     that could leave the count raised. A re-entry or an attempt whose
//     context ends never touches the held node: an attempt deletes only
//     the node it created itself, named by its own guid and sequence.
//   - A non-reentrant attempt by the token holding the lock queues a node
//     of its own behind the held one: TryAcquire is not granted, Wait
//     waits for the release.
//   - Leftovers. A hold all of whose leases ended without Release (the
//     Client declared them lost when renewals went unanswered) is deleted
//     in the background (see Lost leases); a Release whose answer never
//     came is retried in the background; an abandoned attempt's node is
//     deleted at once or in the background. All of them also go with the
//     session.
//
// # Retries, pauses and background work
//
// A call makes only bounded retries within its context: a create whose
// reply was lost is looked up by its guid and retried at most three times
// in all; a Wait whose requests fail because the connection is down
// retries after a pause of 20ms doubling up to a second, until a whole
// session timeout has passed without an answer from the server (the node,
// and the session, may well survive such a disconnection); the look-up
// after a lost create reply retries the same way. Nothing else sleeps.
// The Backend renews nothing itself: go-zookeeper's heartbeats keep the
// session alive, as the protocol requires. Its background work is the
// clean-up of its own leftovers (nodes of abandoned attempts, releases
// that got no answer, holds given up), retried with pauses from 50ms
// doubling up to a second until the node is gone, its session has ended,
// or the Backend is closed; and the existence watches on held nodes.
//
// # Fence
//
// The fence is the lock node's czxid, the zxid of the transaction that
// created it. Holders are granted in sequence order, sequence order is
// creation order, and zxids grow with every transaction of the ensemble,
// so fences strictly increase per key, also across leader changes and
// restarts that keep the data directory. They restart only if
// the ensemble's data is wiped.
//
// # TTL and the session timeout
//
// A lock node lives as long as the session that created it. ZooKeeper
// expires a session when it has received nothing from the client for the
// session timeout T the server negotiated at connect time (the requested
// timeout clamped to [minSessionTimeout, maxSessionTimeout], by default 2
// to 20 × tickTime), and never earlier. The connection's heartbeats keep a
// live, connected session from expiring, so a lock does not need renewing
// on the server; Request.TTL cannot change T.
//
// The dlock Client, however, computes a lease's Expires as invoke time +
// TTL − drift and renews (Refresh) every TTL/3. A successful Refresh sent
// at local time t0 syncs on the session; the server received the sync —
// which counts as contact with the session — at some t1 ≥ t0, and the
// node existed then: the existence watch set on it had not fired when the
// sync's reply came (ZooKeeper sends a watch's event before the reply to
// any later request of the session), or, for a node not watched yet, a
// read after the sync found it. So the session was alive at t1, and the
// server keeps the node until at least t1 + T ≥ t0 + T. A batch of
// renewals (dlock.BatchRefresher) is one sync, whatever its size. The Client's
// Expires is therefore within what the server guarantees exactly when
// TTL ≤ T. zklock rejects a longer TTL (on acquire and on Refresh) with an
// error matching dlock.ErrInvalidTTL. A shorter TTL is safe but costs more
// renewals; whatever the TTL, the lock of a holder that crashed is freed T
// (plus at most one tickTime) after its last contact. Choose T as the
// longest time you accept a dead holder blocking the lock, and TTL = T.
//
// Connect reads T from the server's handshake reply on every connection.
// Until the first reply, SessionTimeout and MaxTTL return the requested
// timeout (in whole milliseconds, as sent), so a Client created right
// after Connect gets the same default TTL as one created later; an
// acquisition or Refresh that comes before the reply waits for it (within
// its context) and checks its TTL against the negotiated T. The server
// raises a request below its minSessionTimeout, which keeps the requested
// value safe; only a request above its maxSessionTimeout is lowered, and
// then a TTL between the two is refused with an error naming both: request
// a timeout the server accepts. go-zookeeper does not expose T for a
// connection made elsewhere, so New needs WithSessionTimeout; without it
// every acquisition fails with dlock.ErrInvalidTTL rather than guess.
//
// MinTTL (dlock.TTLFloor) is 100ms. The Client renews every TTL/3 and a
// renewal is one sync; it keeps retrying a failed renewal until Expires,
// about 2·TTL/3 after it was due. Measured on loopback under -race with
// 2 cores at load average 6.5 (TestMinTTLMeasure): a renewal took
// 0.75ms at the median, 3.8ms at the 99th percentile, 4.3ms at most over
// 200 samples; an uncontended acquisition 1.8ms, 8.8ms and 22ms. At
// 100ms the first renewal has about 66ms before Expires, fifteen times
// the slowest renewal seen, which leaves room for scheduling and garbage
// collection pauses. A shorter TTL is refused with dlock.ErrInvalidTTL.
//
// Ensembles: a follower relays the session contacts it sees to the leader
// with its next ping (every tickTime/2); if it is cut off from the leader
// right after answering a Refresh, the leader's last contact with the
// session may be the previous heartbeat, up to T/3 earlier. The bound
// above is exact for a standalone server; against an ensemble use TTL ≤
// 2T/3. The sync in Refresh makes a lagging follower catch up first, so a
// Refresh never reports a node the leader has already deleted.
//
// # Lost leases
//
//   - Disconnected is "suspended", not lost: the session, and the lock,
//     survive a reconnection within T. Refresh fails meanwhile, and the
//     Client keeps the lease until its Expires, then reports it lost.
//   - A hold whose leases all ended without Release (the Client reported
//     them lost on its own: no successful Refresh until Expires) has its
//     node deleted in the background 250ms later, as soon as the server
//     answers: a holder that gave up must not keep the lock for the rest of
//     its session. A grant whose lease has not registered for loss
//     notification yet counts as a live lease, and a lease that registers
//     for the hold or refreshes it within the 250ms keeps it (a Client may
//     add a nested hold of the same grant just as another one expires).
//   - Session expiry, the node's deletion by anyone but Release (an
//     operator, ForceRelease), or the connection being closed end the lease
//     at once: the Backend keeps a watch on every held node and reports
//     through dlock.LossNotifier, so Lease.Done closes without waiting for
//     the next renewal. (In the first 100ms of a hold, before its watch is
//     set, a deletion is found by Release, Refresh or the setting of the
//     watch.) Refresh finding the node gone, or owned by another session,
//     reports dlock.ErrNotHeld.
//
// Watches on held nodes: a Backend from New keeps go-zookeeper watches
// (a channel and a map entry each) and waits on them from one goroutine
// per 256 held nodes. A Backend from Connect keeps none in go-zookeeper:
// the reads that watch a held node are plain Exists calls whose watch
// flag it sets as the request leaves on the wire, and it reads their
// events off the wire, routed by path to the hold; it watches every held
// node again on each new connection of the session, and reads a session's
// expiry from the handshake. That saves about 600 bytes of client heap
// per held lock (about 400 per lock are left in zklock; the dlock Lease
// costs about 500 more). A callback installed with WithConnOptions
// (zk.WithEventCallback) sees the events of those watches too.
//
// Reconnection: go-zookeeper gives a session handshake 10 × 2/3 of the
// session timeout to be answered. A server whose port accepts connections
// but does not answer yet (a restarting ZooKeeper under load) then keeps
// the client from trying again, and from learning that its session
// expired, for almost seven session timeouts, during which its locks look
// held and its waiters are blind. A Backend made by Connect cuts the
// handshake to 2/3 of the session timeout, as the Java client does.
//
// Session events: go-zookeeper delivers them on the channel zk.Connect
// returns, or to a callback that can only be installed by zk.Connect, so a
// Backend on a connection made elsewhere cannot see them. zklock does not
// need them: it learns of everything that ends a lease from the
// existence watch it keeps on each held node (New: go-zookeeper fires it
// with the node's deletion, and with ErrSessionExpired or ErrClosing when
// it finds the session expired on reconnecting or the connection closed;
// Connect: the same, read off the wire and from the end of the
// connection's event channel), and from Refresh; the Client's Expires
// covers the time in between. So
// New and Connect behave alike; Connect adds that it knows T and owns the
// connection (closing the Backend ends the session, which frees its locks
// at once), New that the caller keeps control of the connection and its
// event channel, and must state T.
package zklock
