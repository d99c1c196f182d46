package dlock

import (
	"context"
	"time"
)

// Backend is the driver a lock server implements. The Client holds all
// policy (waiting, renewal, reentrancy within a Client, loss detection);
// a Backend translates one operation into as few round trips as its
// server allows. It may retry a call internally, within the call's
// context and a bound stated in its doc, when the retry is safe; keep
// alive the session or lease its server protocol requires; and clean up
// its own leftovers in the background. It never waits for a lock to be
// free (except in Waiter.Wait) and never extends a lock on its own. The
// rules every Backend keeps are the lease model in the package overview.
// The backends are listed in the package overview; users rarely
// implement one.
//
// Every method must be safe for concurrent use, honour ctx, and translate
// driver-specific "nothing there" results into the errors of this package.
type Backend interface {
	// TryAcquire makes one attempt to take the lock r.Key for r.Token with
	// lifetime r.TTL. When the lock is taken by another token it returns
	// Grant{OK: false} and a nil error, with Grant.HolderTTL set when the
	// backend knows the holder's remaining lifetime. When r.Reentrant is
	// set and r.Token already holds the lock, the hold count grows, the
	// deadline becomes the later of the current one and now + r.TTL, and
	// the holder's fence is returned again.
	TryAcquire(ctx context.Context, r Request) (Grant, error)

	// Refresh sets the lock's deadline to the later of the current one and
	// now + r.TTL if r.Token still holds the grant r.Fence names; otherwise
	// it returns ErrNotHeld and changes nothing.
	Refresh(ctx context.Context, r Request) error

	// Release gives up one hold of r.Token's grant r.Fence on r.Key (the
	// whole lock unless it is reentrant with a count above one). It returns
	// ErrNotHeld, and changes nothing, when that grant does not hold it.
	Release(ctx context.Context, r Request) error

	// Close frees what the backend opened itself (subscriptions, sessions).
	// It does not close clients passed in by the user.
	Close() error
}

// Request describes one lock operation for a Backend.
//
// On TryAcquire, Fence is 0 from the Client. A composite backend (one
// that takes a quorum of other backends) may set it to a floor: a backend
// that supports it then issues a fresh grant a fence of at least Fence;
// others ignore it.
type Request struct {
	Key       string        // the user's key, validated by the Client
	Token     string        // the owner token: unique per lease, or the WithOwner id
	TTL       time.Duration // the lease's lifetime, at least MinTTL
	Reentrant bool          // same Token re-enters instead of waiting (WithOwner; first hold of the owner in a Client)
	FIFO      bool          // ask a Waiter for strict arrival order (WithFIFO)
	Fence     uint64        // on Refresh and Release: the fence the grant returned; on TryAcquire: 0, or a floor (see below)

	// Kind is what the hold grants: KindLock (the zero value) unless the
	// backend reports another kind through KindSupporter.
	Kind Kind
	// Permits is the semaphore's number of permits, for KindPermit.
	Permits int
	// Waiting tells TryAcquire of a KindLock request that the Client
	// will retry it: while readers hold the key, the request keeps new
	// readers out (see KindRead) until it is granted, its TTL passes, or
	// the Client gives up: a Release with Waiting set and Fence 0
	// withdraws the claim and returns ErrNotHeld, releasing no hold (not
	// one a WithOwner token has).
	Waiting bool
	// Value is stored with a KindLock grant by a Proclaimer (an elected
	// leader's value) and replaced by SetValue.
	Value string
}

// Grant is the result of one acquisition attempt.
type Grant struct {
	OK        bool          // the lock is now held by the request's token
	Fence     uint64        // when OK: the fencing token, strictly increasing per key
	Count     int           // when OK: holds by this token including this one (1 unless reentrant)
	HolderTTL time.Duration // when !OK: the current holder's remaining lifetime, 0 if unknown

	// Since, when set, is a time no later than the invoke of the server
	// operation that last set the lock's lifetime to the request's TTL, or
	// to TTL below (the grant at the end of a queue wait, a keep-alive, a
	// hand-off). The Client
	// computes Expires from it instead of from the start of the call,
	// which matters after a long Waiter.Wait. Zero: the call's start.
	Since time.Time

	// TTL, when set and shorter than the request's TTL, is the lifetime
	// the lock has from Since so far: a lock a release handed over to a
	// queue waiter, reserved for it for a short time, that the waiter has
	// not yet confirmed with a request of its own. The Client computes
	// Expires from it and confirms the lease with a Refresh (r.TTL): with
	// auto-renew by its first renewal, due TTL/3 after Since; without, at
	// once, before Acquire returns. Zero: the request's TTL.
	TTL time.Duration
}

// BatchRefresher is an optional Backend capability: refresh many locks in
// as few round trips as possible (one per server). The result has one
// entry per request, nil for success. The watchdog uses it when present,
// with at most 10,000 requests per call; without it, it calls Refresh for
// each lease, up to 256 at once.
type BatchRefresher interface {
	RefreshMany(ctx context.Context, rs []Request) []error
}

// Notifier is an optional Backend capability: tell waiters when a key is
// released, so they retry at once instead of polling.
type Notifier interface {
	// Subscribe returns a channel that receives a value (sent without
	// blocking, buffer one) after each release of key, and a function that
	// ends the subscription; it returns once the subscription is active, so
	// a release after Subscribe returns is never missed by a live
	// connection. Notifications are hints: a lost one costs the waiter at
	// most the holder's remaining TTL.
	Subscribe(ctx context.Context, key string) (ch <-chan struct{}, stop func(), err error)
}

// Waiter is an optional Backend capability: a server-side queue. Wait
// blocks until r is granted or ctx ends; when it fails it removes its
// queue entry and, with r.Waiting, withdraws the writer's claim (with a
// fresh context), and when ctx ended returns an error matching
// ctx.Err(). The Client calls Wait for WithFIFO requests, and for every
// wait when the backend is not also a Notifier (then the queue is how it
// waits, and it may ignore r.FIFO). A backend may return
// errors.ErrUnsupported for a request it cannot queue; without WithFIFO
// the Client then waits by retrying.
type Waiter interface {
	Wait(ctx context.Context, r Request) (Grant, error)
}

// QueueTrier is an optional capability of a Waiter: TryBeforeQueue
// reports that a failed TryAcquire costs no more than a look (it leaves
// nothing behind to clean up), so the Client makes one plain attempt on a
// key nobody queued for lately before joining the queue.
type QueueTrier interface {
	TryBeforeQueue() bool
}

// LossNotifier is an optional Backend capability for servers that learn of
// a lost lock without being asked (a session that expired, a lease
// revoked, a watched key deleted). fn is called at most once, from any
// goroutine, with an error explaining the loss; stop cancels the
// notification and must be called when the lease ends. When the last
// registration of a hold stops while no Release of it is under way, the
// Backend may take that as the hold given up and free it: the Client
// stops a registration after it gave the lock back, or when it will not
// (a lease lost locally; a hold whose other leases remain), never before
// a Release of the same hold.
type LossNotifier interface {
	NotifyLoss(r Request, fn func(cause error)) (stop func())
}

// Info describes a lock as the server sees it, for operators (the dlock
// CLI's inspect command). Zero values mean "not held" or "unknown".
type Info struct {
	Key     string        // the user's key
	Held    bool          // someone holds the lock now
	Owner   string        // the holder's token, when held
	Fence   uint64        // the holder's fence, when held
	TTL     time.Duration // the holder's remaining lifetime, 0 if unknown
	Count   int           // the holder's reentrant hold count, when held
	Waiters int           // waiters queued server-side, -1 if the backend cannot tell

	// Kind is KindPermit or KindRead when the key holds a semaphore's
	// permits or a read-write lock's read holds (listed in Holds; Owner,
	// Fence, TTL and Count then describe no one), else KindLock.
	Kind    Kind
	Value   string // the holder's value (Proclaimer), when held
	Permits int    // KindPermit: the semaphore's number of permits
	Holds   []Hold // KindPermit, KindRead: the holds, in no order
}

// Hold is one permit or read hold, for Info.
type Hold struct {
	Owner string        // the holder's token
	Fence uint64        // the hold's fence
	TTL   time.Duration // its remaining lifetime, 0 if unknown
}

// Inspector is an optional Backend capability: read a lock's state
// without changing it.
type Inspector interface {
	Inspect(ctx context.Context, key string) (Info, error)
}

// ForceReleaser is an optional Backend capability for administrators:
// delete a lock whoever holds it, returning what was removed (Held false
// when there was nothing). The holder's lease is then lost at its next
// renewal. Never used by the Client.
type ForceReleaser interface {
	ForceRelease(ctx context.Context, key string) (Info, error)
}

// TTLFloor is an optional Backend capability for servers that cannot keep
// a very short lease alive: MinTTL is the shortest TTL the backend renews
// reliably (its renewal period TTL/3 must cover a round trip with margin).
// The Client refuses a shorter TTL with an ErrInvalidTTL error.
type TTLFloor interface {
	MinTTL() time.Duration
}

// TTLLimiter is an optional Backend capability for servers that cannot
// hold a lease longer than some bound (a session timeout).
// A Client created without WithTTL uses MaxTTL, read at each Acquire,
// when it is below DefaultTTL; an explicit WithTTL above it fails at
// Acquire with the backend's ErrInvalidTTL error. MaxTTL returns 0 when
// there is no bound.
type TTLLimiter interface {
	MaxTTL() time.Duration
}
