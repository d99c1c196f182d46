// Package verify is a Jepsen-style harness that measures what a dlock
// backend guarantees under faults. It backs the command `dlock verify`.
//
// No lease-based lock can promise mutual exclusion by itself: a holder that
// stops (GC pause, SIGSTOP, a slow disk) past its TTL still believes it
// holds the lock while the server grants it to someone else. What a lock
// can promise, and what this package measures, is narrower:
//
//   - lease overlap: the server never grants a lock while another owner's
//     lease is certainly live on it;
//   - fence order: a grant that begins after another completed gets a
//     larger fence;
//   - resource safety: a resource that checks fences accepts no stale
//     write and loses no update;
//   - liveness: after a holder dies or stops, someone else gets the lock
//     within about a TTL, and every worker gets it once more when the
//     faults stop.
//
// # How a run works
//
// Run (the coordinator) starts, for every run, a "resource" redis-server
// (never faulted) and, when the backend URL's host is "local", the lock
// server(s) too (internal/testserver). It starts Config.Workers worker
// processes by re-executing the program (Config.Exe, which must end up in
// WorkerMain), so that stopping a worker stops its lease watchdog too.
// Each worker loops: acquire the lock (dlock.Client, auto-renewed) → read
// a register → spend TTL/10–TTL/4 → write the register plus one → release.
// Two registers: the fenced one (the read claims the lease's fence with a
// script in package fence's layout, the write is fence.Redis.Set), and the
// naive one (plain GET and SET), the negative control. A fence checked only
// on the write would not protect a read-modify-write — the old holder could
// write between the new holder's read and write — so the read claims the
// fence too. With Config.FIFO every Acquire passes dlock.WithFIFO(): a
// worker joins the backend's server-side queue at once, without a first
// plain attempt (redislock, etcdlock and zklock queue every wait anyway;
// a release hands the lock to the next waiter). The report labels such
// runs "(FIFO)".
//
// Every process writes its history as JSON lines (Event) stamped with
// CLOCK_MONOTONIC, which all processes on the machine share; the fault
// injector ("nemesis") logs its windows. Workers also report their progress
// on standard output ("acq FENCE OWNER", "read", "wrote", "rel"), which is
// how the injector finds the current holder.
//
// # Kinds
//
// Config.Kind runs the same loop on the key's other primitives. With
// "permits:N" every worker takes one permit of an N-permit semaphore
// (Client.Semaphore) and does the read-modify-write under it; right after
// each grant it logs the server's listing of the key's holds
// (dlock.Inspector, OpInspect). With "rw" (Client.RWLock) one acquisition
// in four is a write hold doing the read-modify-write, the others read
// holds that touch no register and hold as long. With "election"
// (Client.Election) every worker campaigns, leads for its
// read-modify-write and resigns. Each acquisition's Event.Hold names what
// it took, which is how Check tells the kinds apart; the report labels
// such rows "[KIND]". The lease-overlap claim (a) becomes the kind's
// exclusion, on the same conservative intervals: no permit granted while
// N others were certainly live, and no listing of more than N holds; no
// read hold overlapping a write hold, no two write holds; no two
// leaderships. Fence order (b) covers every permit, every leadership and
// every write hold, whose fence must be above that of every grant
// completed before it was invoked, readers' included. The registers see
// only writers; under "permits:N" with N > 1 the fenced register rejects
// the concurrent holders' superseded claims, as it should, and the naive
// one is damaged by design. Belief overlap counts conflicting critical
// sections (for permits, those begun while N others were under way).
// Under a kind, a pause has its effect, and a fault's liveness interval
// ends, only with a grant showing that the server let the victim's hold
// go: a permit granted while N−1 permits of other owners were certainly
// live (N others at once: taking the free permit proves nothing), a write
// hold when the victim was a reader (any hold when it was a writer), any
// leadership.
//
// # Faults
//
// See the Fault constants. The schedule — gaps of 1–2 × TTL, the kind of
// each fault and its parameters — is drawn from Config.Seed and replays
// exactly; which process a fault hits depends on who holds the lock then.
// A pause aims at a holder between its read and its write (waiting up to
// 2 × TTL for one), the window in which a stopped holder turns stale. The
// proxy fault routes the workers through an in-process TCP proxy on
// loopback. restart, restart-persist and server-pause need a local server
// ("redis://local", "redlock://local", "etcd://local", "zk://local",
// "postgres://local").
//
// Replicated deployments are local servers too: "redis+sentinel://local"
// (a primary, two replicas, three sentinels), "redis+cluster://local"
// (three primaries with one replica each), "etcd://local?n=3" (a cluster)
// and "zk://local?n=3" (an ensemble). leader-kill and leader-pause hit
// whichever node leads when the fault begins — the primary the sentinels
// name, the primary of the lock key's slot, the member that reports itself
// etcd leader, the ZooKeeper server in Mode: leader — for 3–5 × TTL and at
// least the deployment's failover time, and the window records whether
// and when another node took over. A Redis node comes back empty, so a
// lock only it had is lost, and a returning former primary may serve as a
// second primary until it is demoted: the lease overlaps this causes are
// what the fault measures. leader-partition runs every etcd or ZooKeeper
// member, or every data node of a Sentinel group (the sentinels stay on
// loopback), in its own network namespace behind a bridge and takes the
// leader's or primary's link down for the same time, cutting it off from
// the other nodes, the sentinels and every worker, then heals the
// partition. The proxy
// fault on a cluster puts one proxy in front of every member, which cuts
// the workers off some members (a partition between clients and servers
// that heals); members keep talking to each other.
//
// # Positive controls
//
// A harness that never reports a violation proves nothing until it is
// shown one. The backend URL parameter "weaken" (WeakenParam, understood
// by an OpenFunc wrapped with WithWeakening, as the dlock command's is)
// runs the same workers on a deliberately broken lock over the same
// deployment and faults: "forget" releases every grant on the server as
// soon as it is made while the Client believes it holds the lock, so the
// run must FAIL with lease overlaps; "same-fence" also reports fence 1 for
// every grant, so it must FAIL with fence regressions too; and
// "no-fence-check" also turns the fenced register's check off (the
// workers read and write it without comparing fences), so it must FAIL
// with stale writes accepted by the fenced register.
//
// # Checks
//
// Check turns a history into Findings: (a) lease overlaps, where a lease is
// certainly live from the completion of its Acquire until the conservative
// expiry of its last successful renewal (dlock.Lease.Expires: invocation
// + TTL − drift) or the invocation of its release — a conservative
// interval, so a reported overlap is certain and the count is a lower bound
// (a release that failed on the network still ends the interval); (b)
// fence regressions;
// (c) per register, stale writes accepted (a write whose fence is below one
// that had already read or written the register), stale writes rejected,
// and lost updates (acknowledged increments in the register's log minus
// its final value), plus porcupine's linearizability check of the
// read-modify-writes as atomic increments, with an HTML timeline (fault
// windows and leases drawn in) written next to the history; (d) belief
// overlap, critical sections of different owners overlapping in time as
// the workers saw them (expected under pauses); (e) liveness, from each
// effective fault to the next grant to another owner, and a quiet phase in
// which every worker must acquire once.
//
// A run FAILs on a lease overlap, a fence regression, a stale write
// accepted or an update lost by the fenced register, a non-linearizable
// fenced history, a worker without a quiet-phase grant or a crashed
// worker. It is INVALID — not passed — when a requested fault never had its
// effect (a pause that never caught a holder, a restart no worker noticed)
// or when, under pauses, the naive register showed no violation at all.
// A pause has its effect when another owner was granted the lock while
// the holder was stopped, and the holder had not begun its release before
// the stop (the injector learns who holds the lock from the workers'
// output, so a stop can land just after a release).
// A server outage (restart, server pause, proxy blackhole) has its effect
// when a lock operation failed, or one invoked during the outage waited
// for its end (clients that retry, as etcd's and ZooKeeper's do), or — on
// one node of a cluster, which a quorum masks — when the other nodes
// granted or renewed a lease while that node was unreachable. A proxy
// delay has its effect when a release took at least the delay or, for
// clients whose per-node timeout is shorter (Redlock), an operation failed.
//
// Each run's RunResult is saved as SummaryFile in its directory;
// ReadReport reads them back, for one table over campaigns run by
// separate processes.
//
// # Backends
//
// The harness needs a backend that several processes can share: a server.
// memlock lives in one process; with Config.InProcess the workers are
// goroutines sharing one Client, without faults. A backend whose
// connection has its own timeout (a ZooKeeper session) must derive it from
// the TTL the OpenFunc receives. The OpenFunc keeps this
// package independent of the backends: the program maps URLs to backends.
package verify
