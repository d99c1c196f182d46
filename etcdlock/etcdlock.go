package etcdlock

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock"
)

const (
	// MinTTL is the smallest lock TTL the backend accepts. etcd counts
	// lease TTLs in whole seconds and raises any TTL below about 1.5 × its
	// election timeout (2 s with the default 1 s) to that minimum; a
	// Request.TTL below MinTTL fails with an error matching
	// dlock.ErrInvalidTTL. TTLs are rounded up to whole seconds.
	MinTTL = 2 * time.Second

	// DefaultPrefix is the etcd key prefix of all lock keys unless
	// WithPrefix sets another.
	DefaultPrefix = "/dlock/"

	// maxTTL is etcd's largest lease TTL (MaxLeaseTTL, 9e9 s).
	maxTTL = 9_000_000_000 * time.Second

	// cleanupTimeout bounds the background deletes of entries the Backend
	// no longer tracks and the lease revocations of Close.
	cleanupTimeout = 5 * time.Second

	// anchorRetry is the pause before anchorLoop watches again after its
	// watch ended (the server lost its leader, the connection broke).
	anchorRetry = time.Second

	// abandonTimeout bounds how long a cancelled Wait (or a failed
	// acquisition) waits for the deletion of its entry before returning;
	// if the server did not answer by then, the Backend keeps trying in the
	// background (and the entry expires with its lease anyway).
	abandonTimeout = time.Second

	// sweepMinDelay and sweepMaxDelay bound the pause between two passes
	// of the background removal of orphans while some remain (see
	// sweepLocked).
	sweepMinDelay = 50 * time.Millisecond
	sweepMaxDelay = time.Second

	// maxCAS bounds the compare-and-swap retries on a reentrant entry's
	// hold count (each retry means another holder of the same owner token
	// changed it meanwhile).
	maxCAS = 16
)

var errClosed = fmt.Errorf("etcdlock: %w", dlock.ErrClosed)

// lossWatchDelay is how long after a grant the deletion watch of the
// lock starts (from the grant's revision); see addHold. 50 ms; a variable
// for the tests.
var lossWatchDelay atomic.Int64

func init() { lossWatchDelay.Store(int64(50 * time.Millisecond)) }

// Protocol switches: both on; the hand-off benchmark turns them off in
// some of its runs to measure what they save (export_test.go).
var (
	// watchAhead: a waiter third or further in line also watches the
	// entry before its predecessor (see awaitDelete).
	watchAhead atomic.Bool
	// reuseRenewal: a grant shortly after a renewal of its lease counts
	// from that renewal instead of renewing again (see renewedAt).
	reuseRenewal atomic.Bool
	// anchorStream: a Backend keeps its waiters' watch stream open between
	// waits (see anchorLoop).
	anchorStream atomic.Bool
	// shareWatches: a Backend's waiters share their entry watches and
	// keep them open a while (see entrywatch.go).
	shareWatches atomic.Bool
)

func init() {
	watchAhead.Store(true)
	reuseRenewal.Store(true)
	anchorStream.Store(true)
	shareWatches.Store(true)
}

// An Option configures a Backend in New.
type Option func(*config) error

type config struct {
	prefix string
}

// WithPrefix sets the etcd key prefix under which lock keys are created
// (used verbatim: end it with "/"). Default DefaultPrefix ("/dlock/").
// Every Backend taking the same locks must use the same prefix. An empty
// prefix is an error matching dlock.ErrInvalidOption.
func WithPrefix(prefix string) Option {
	return func(c *config) error {
		if prefix == "" {
			return fmt.Errorf("etcdlock: empty prefix: %w", dlock.ErrInvalidOption)
		}
		c.prefix = prefix
		return nil
	}
}

// Backend is a dlock.Backend on an etcd cluster. It implements
// dlock.Backend, dlock.BatchRefresher, dlock.Waiter and
// dlock.LossNotifier; see the package documentation for the algorithm.
// Create it with New; it is safe for concurrent use.
type Backend struct {
	cli     *clientv3.Client
	prefix  string
	err     error              // configuration error from New
	ctx     context.Context    // the Backend's lifetime: cancelled by Close
	cancel  context.CancelFunc //
	waitCtx context.Context    // ctx, requiring a leader: the waiters' watch stream

	id       string // random: names the entries of non-reentrant requests (keys.go)
	mu       sync.Mutex
	closed   bool
	leases   map[int64]*leaseState // live leases by TTL in seconds
	held     map[string]*held      // granted entries by etcd key
	pw       *prefixWatch          // the deletion watch over the prefix, with many held (prefixwatch.go)
	watching map[*held]struct{}    // held entries with a deletion watch of their own (watch.go)
	slots    map[string]*slot      // entry names of non-reentrant requests served, by name (keys.go)
	wide     map[string]int        // lock keys with slots above 0: 1 + the highest slot number in use
	orphans  map[string]orphan     // entries to delete, by etcd key
	busy     map[string]struct{}   // orphans being removed right now
	sweeping bool                  // sweepLoop runs
	looping  bool
	anchored bool // anchorLoop runs
	// Entry watches of the waiters (entrywatch.go), by etcd key.
	entries     map[string]*entryWatch
	idleWatches int         // entries no waiter uses
	reaper      *time.Timer // runs reapEntries
	kick        chan struct{}
	wg          sync.WaitGroup
}

// orphan is a claim on an entry the Backend no longer tracks but could
// not remove from the server yet. With fence 0 the entry's creation had an
// unknown outcome: it is deleted only if it still has lease and value.
type orphan struct {
	fence  int64
	claims int
	lease  clientv3.LeaseID
	value  string
}

var (
	_ dlock.Backend        = (*Backend)(nil)
	_ dlock.BatchRefresher = (*Backend)(nil)
	_ dlock.Waiter         = (*Backend)(nil)
	_ dlock.LossNotifier   = (*Backend)(nil)
)

// New returns a Backend taking locks on the etcd cluster of cli,
// configured by opts. New does not contact the server; the first
// acquisition grants the Backend's lease. cli stays the caller's: Close
// does not close it. If cli is nil or an option is invalid, the Backend
// is still returned but every call fails with that error, which Err also
// returns (and dlock.New's Client reports it on its first call).
func New(cli *clientv3.Client, opts ...Option) *Backend {
	ctx, cancel := context.WithCancel(context.Background())
	b := &Backend{
		cli:      cli,
		prefix:   DefaultPrefix,
		ctx:      ctx,
		cancel:   cancel,
		waitCtx:  clientv3.WithRequireLeader(ctx),
		leases:   make(map[int64]*leaseState),
		id:       rand.Text(),
		held:     make(map[string]*held),
		watching: make(map[*held]struct{}),
		slots:    make(map[string]*slot),
		wide:     make(map[string]int),
		orphans:  make(map[string]orphan),
		busy:     make(map[string]struct{}),
		kick:     make(chan struct{}, 1),
		entries:  make(map[string]*entryWatch),
	}
	if cli == nil {
		b.err = fmt.Errorf("etcdlock: nil etcd client: %w", dlock.ErrInvalidOption)
		return b
	}
	cfg := config{prefix: DefaultPrefix}
	for _, o := range opts {
		if o == nil {
			b.err = fmt.Errorf("etcdlock: nil Option: %w", dlock.ErrInvalidOption)
			return b
		}
		if err := o(&cfg); err != nil {
			b.err = err
			return b
		}
	}
	b.prefix = cfg.prefix
	return b
}

// Err returns the configuration error recorded by New, or nil.
func (b *Backend) Err() error { return b.err }

// Prefix returns the etcd key prefix of the Backend's lock keys.
func (b *Backend) Prefix() string { return b.prefix }

// check validates r and returns its lease TTL in seconds.
func (b *Backend) check(r dlock.Request) (int64, error) {
	if err := b.checkName(r); err != nil {
		return 0, err
	}
	return ttlSeconds(r.TTL)
}

func (b *Backend) checkName(r dlock.Request) error {
	if b.err != nil {
		return b.err
	}
	if err := dlock.ValidateKey(r.Key); err != nil {
		return fmt.Errorf("etcdlock: %w", err)
	}
	if r.Token == "" {
		return fmt.Errorf("etcdlock: empty owner token: %w", dlock.ErrInvalidOption)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return errClosed
	}
	return nil
}

func errNotHeld(key string) error {
	return fmt.Errorf("etcdlock: lock %q is not held by this owner: %w", key, dlock.ErrNotHeld)
}

func errWrongType(name string) error {
	return fmt.Errorf("etcdlock: key %s: %w", name, dlock.ErrWrongType)
}

func errTokenInUse(key string) error {
	return fmt.Errorf("etcdlock: lock %q: the owner token already holds or waits for it and the request is not reentrant: %w", key, dlock.ErrNotAcquired)
}

// dead reports whether ls is known gone.
func (b *Backend) dead(ls *leaseState) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return ls.dead != nil
}

// TryAcquire implements dlock.Backend with one transaction: if nobody
// holds or waits for the lock (no key under its directory), it creates the
// owner's entry with the Backend's lease; otherwise it writes nothing and
// returns Grant{OK: false}, with HolderTTL set when the holder's lease is
// this Backend's own (its remaining validity is known without a round
// trip), else 0. Queued waiters are never overtaken. A reentrant owner
// that holds the lock gets its count raised and its fence back. Unless the
// lease was renewed since the call began, or at most TTL/10 before it
// (then Grant.Since is that renewal), a keep-alive is sent concurrently
// with the transaction, so a grant is valid on the server for at least
// TTL from Grant.Since or the call.
func (b *Backend) TryAcquire(ctx context.Context, r dlock.Request) (dlock.Grant, error) {
	start := time.Now()
	sec, err := b.check(r)
	if err != nil {
		return dlock.Grant{}, err
	}
	dir := b.dir(r.Key)
	b.clearOrphans(ctx, dir)
	name := b.claimName(r)
	granted := false
	defer func() {
		if !granted {
			b.unclaim(r, name)
		}
	}()
	for attempt := 1; ; attempt++ {
		ls, err := b.lease(ctx, sec)
		if err != nil {
			return dlock.Grant{}, err
		}
		since, reuse := b.renewedAt(ls, r.TTL)
		wait := func() error { return nil }
		if !reuse {
			wait = b.startFresh(ctx, ls, start, r.TTL)
		}
		resp, err := b.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(dir), "=", 0).WithPrefix()).
			Then(clientv3.OpPut(name, encodeValue(1, r.Token), clientv3.WithLease(ls.id))).
			Else(clientv3.OpGet(name), clientv3.OpGet(dir, append(clientv3.WithFirstCreate(), clientv3.WithKeysOnly())...)).
			Commit()
		kaErr := wait()
		if isLeaseNotFound(err) {
			b.leaseGone(ls, fmt.Errorf("etcdlock: lease %x expired or was revoked: %w", int64(ls.id), dlock.ErrNotHeld))
			if attempt < 3 {
				continue
			}
			return dlock.Grant{}, fmt.Errorf("etcdlock: acquire %q: %w", r.Key, err)
		}
		if err != nil {
			// The transaction may have been applied (its reply lost, or ctx
			// ended meanwhile): remove the entry it would have created.
			b.dropCreated(ctx, name, ls.id, r.Token)
			return dlock.Grant{}, fmt.Errorf("etcdlock: acquire %q: %w", r.Key, err)
		}
		if resp.Succeeded {
			fence := resp.Header.Revision
			if kaErr != nil {
				// The entry exists, but its lease may end before the
				// Client's lease would: take it back.
				b.abandon(ctx, r.Key, name, fence, false)
				if b.dead(ls) && attempt < 3 {
					continue
				}
				return dlock.Grant{}, kaErr
			}
			b.addHold(name, r.Key, r.Token, fence, ls, 1, fence, fence+1)
			granted = true
			return dlock.Grant{OK: true, Fence: uint64(fence), Count: 1, Since: since}, nil
		}
		own := resp.Responses[0].GetResponseRange().Kvs
		head := resp.Responses[1].GetResponseRange().Kvs
		if len(own) > 0 {
			_, token, ok := decodeValue(own[0].Value)
			switch {
			case !r.Reentrant && (!ok || token != r.Token):
				// A leftover of an earlier use of our slot: ours to remove.
				b.retireSlot(r, name, own[0].CreateRevision)
			case !ok || token != r.Token:
				return dlock.Grant{}, errWrongType(name)
			case len(head) > 0 && string(head[0].Key) == name:
				if !r.Reentrant {
					return dlock.Grant{}, errTokenInUse(r.Key)
				}
				g, err := b.reenter(ctx, r, own[0], start)
				granted = err == nil
				return g, err
			}
			// Queued by a concurrent Wait of the same owner: not granted.
		}
		var g dlock.Grant
		if len(head) > 0 {
			g.HolderTTL = b.holderTTL(clientv3.LeaseID(head[0].Lease))
		}
		return g, nil
	}
}

// reenter raises the hold count of the owner's entry kv, which heads the
// queue, and returns the grant.
func (b *Backend) reenter(ctx context.Context, r dlock.Request, kv *mvccpb.KeyValue, start time.Time) (dlock.Grant, error) {
	name := string(kv.Key)
	count, _, _ := decodeValue(kv.Value)
	n, mod, _, err := b.bump(ctx, name, r.Key, r.Token, kv.CreateRevision, count, kv.ModRevision, +1)
	if err != nil {
		return dlock.Grant{}, err
	}
	ls := b.leaseFor(clientv3.LeaseID(kv.Lease))
	if err := b.ensureFresh(ctx, ls, start, r.TTL); err != nil {
		b.abandon(ctx, r.Key, name, kv.CreateRevision, true)
		return dlock.Grant{}, err
	}
	b.addHold(name, r.Key, r.Token, kv.CreateRevision, ls, n, mod, mod)
	return dlock.Grant{OK: true, Fence: uint64(kv.CreateRevision), Count: n}, nil
}

// bump adds delta to the hold count of the entry name created at fence,
// deleting it when the count reaches zero, by compare-and-swap on its mod
// revision. count and mod are the last known state (mod 0: unknown, read
// it first). It returns the new count and mod revision, and whether the
// entry was deleted; an error matching dlock.ErrNotHeld if the entry is
// gone or was created again.
func (b *Backend) bump(ctx context.Context, name, key, token string, fence int64, count int, mod int64, delta int) (int, int64, bool, error) {
	for range maxCAS {
		if mod != 0 {
			n := count + delta
			op := clientv3.OpDelete(name)
			if n > 0 {
				op = clientv3.OpPut(name, encodeValue(n, token), clientv3.WithIgnoreLease())
			}
			resp, err := b.cli.Txn(ctx).
				If(clientv3.Compare(clientv3.CreateRevision(name), "=", fence),
					clientv3.Compare(clientv3.ModRevision(name), "=", mod)).
				Then(op).
				Else(clientv3.OpGet(name)).
				Commit()
			if err != nil {
				return 0, 0, false, fmt.Errorf("etcdlock: lock %q: %w", key, err)
			}
			if resp.Succeeded {
				return max(n, 0), resp.Header.Revision, n <= 0, nil
			}
			kvs := resp.Responses[0].GetResponseRange().Kvs
			if len(kvs) == 0 || kvs[0].CreateRevision != fence {
				return 0, 0, false, errNotHeld(key)
			}
			c, t, ok := decodeValue(kvs[0].Value)
			if !ok || (token != "" && t != token) {
				return 0, 0, false, errWrongType(name)
			}
			count, token, mod = c, t, kvs[0].ModRevision
			continue
		}
		resp, err := b.cli.Get(ctx, name)
		if err != nil {
			return 0, 0, false, fmt.Errorf("etcdlock: lock %q: %w", key, err)
		}
		if len(resp.Kvs) == 0 || resp.Kvs[0].CreateRevision != fence {
			return 0, 0, false, errNotHeld(key)
		}
		c, t, ok := decodeValue(resp.Kvs[0].Value)
		if !ok || (token != "" && t != token) {
			return 0, 0, false, errWrongType(name)
		}
		count, token, mod = c, t, resp.Kvs[0].ModRevision
	}
	return 0, 0, false, fmt.Errorf("etcdlock: lock %q: hold count changed %d times in a row, giving up", key, maxCAS)
}

// deleteEntry deletes the entry name if it is still the incarnation
// created at fence; never a newer one (etcd issue #22082).
func (b *Backend) deleteEntry(ctx context.Context, key, name string, fence int64) error {
	resp, err := b.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(name), "=", fence)).
		Then(clientv3.OpDelete(name)).
		Commit()
	if err != nil {
		return fmt.Errorf("etcdlock: release %q: %w", key, err)
	}
	if !resp.Succeeded {
		return errNotHeld(key)
	}
	return nil
}

// abandon removes one claim on the entry name (a queue entry given up or
// a grant taken back) with a fresh context derived from ctx, bounded by
// abandonTimeout; when the server cannot be reached the entry is kept as
// an orphan and removed later.
func (b *Backend) abandon(ctx context.Context, key, name string, fence int64, reentrant bool) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), abandonTimeout)
	defer cancel()
	var err error
	if reentrant {
		_, _, _, err = b.bump(cctx, name, key, "", fence, 0, 0, -1)
	} else {
		err = b.deleteEntry(cctx, key, name, fence)
	}
	if err != nil && !errors.Is(err, dlock.ErrNotHeld) && !errors.Is(err, dlock.ErrWrongType) {
		b.mu.Lock()
		b.orphanLocked(name, fence, 1)
		b.sweepLocked()
		b.mu.Unlock()
	}
}

// retireSlot gives up r's slot name, found taken by an entry created at
// fence that r did not create: a leftover of an earlier acquisition
// through this Backend (only this Backend uses its slot names) that was
// not known to exist. It is deleted in the background; r gets another
// slot from claimName.
func (b *Backend) retireSlot(r dlock.Request, name string, fence int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if s := b.slots[name]; s != nil && s.token == r.Token {
		b.freeSlotLocked(r.Key, name)
	}
	if _, ok := b.orphans[name]; !ok {
		b.orphanLocked(name, fence, 1)
	}
	b.sweepLocked()
}

// dropCreated deletes the entry name if it is still exactly as a create
// transaction with an unknown outcome would have left it: on lease id with
// value "1 token". It uses a fresh context derived from ctx, bounded by
// abandonTimeout; when the server cannot be reached the entry is kept as
// an orphan and removed later.
func (b *Backend) dropCreated(ctx context.Context, name string, id clientv3.LeaseID, token string) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), abandonTimeout)
	defer cancel()
	value := encodeValue(1, token)
	if err := b.deleteIfCreated(cctx, name, id, value); err != nil {
		b.mu.Lock()
		b.orphans[name] = orphan{lease: id, value: value, claims: 1}
		b.sweepLocked()
		b.mu.Unlock()
	}
}

func (b *Backend) deleteIfCreated(ctx context.Context, name string, id clientv3.LeaseID, value string) error {
	_, err := b.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.LeaseValue(name), "=", id),
			clientv3.Compare(clientv3.Value(name), "=", value)).
		Then(clientv3.OpDelete(name)).
		Commit()
	return err
}

// holderTTL returns the remaining validity of lease id if it is one of the
// Backend's own leases, else 0.
func (b *Backend) holderTTL(id clientv3.LeaseID) time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, ls := range b.leases {
		if ls.isReady() && ls.err == nil && ls.id == id {
			return max(time.Until(ls.validUntil), 0)
		}
	}
	return 0
}

// Refresh implements dlock.Backend: it renews the lease the lock is
// attached to (one KeepAliveOnce) and returns an error matching
// dlock.ErrNotHeld if that lease is gone or the lock's key was deleted.
// See RefreshMany.
func (b *Backend) Refresh(ctx context.Context, r dlock.Request) error {
	return b.RefreshMany(ctx, []dlock.Request{r})[0]
}

// RefreshMany implements dlock.BatchRefresher: one KeepAliveOnce per
// distinct lease among rs (usually one: all locks of a Backend with the
// same TTL share a lease), sent concurrently. A lock whose entry is known
// deleted, or whose lease is gone, gets an error matching
// dlock.ErrNotHeld. A request whose TTL rounds to another number of
// seconds than the lock's lease moves the lock to the Backend's lease of
// that TTL (one more transaction). A lock this Backend did not grant is
// looked up on the server first (one more read).
func (b *Backend) RefreshMany(ctx context.Context, rs []dlock.Request) []error {
	errs := make([]error, len(rs))
	secs := make([]int64, len(rs))
	for i, r := range rs {
		secs[i], errs[i] = b.check(r)
	}
	groups := make(map[*leaseState][]int)
	hs := make([]*held, len(rs)) // the holds renewed by their lease
	var slow []int
	b.mu.Lock()
	for i, r := range rs {
		if errs[i] != nil {
			continue
		}
		h := b.heldLocked(r.Key, r.Token)
		switch {
		case h == nil || h.fence != fenceRev(r.Fence):
			slow = append(slow, i)
		case h.lost != nil:
			errs[i] = h.lost
		case h.lease.sec != secs[i] && !h.lease.foreign:
			slow = append(slow, i)
		default:
			groups[h.lease] = append(groups[h.lease], i)
			hs[i] = h
		}
	}
	if len(b.orphans) > 0 {
		b.sweepLocked()
	}
	b.mu.Unlock()

	var wg sync.WaitGroup
	for ls, idx := range groups {
		renew := func() {
			err := b.keepAlive(ctx, ls)
			for _, i := range idx {
				errs[i] = err
			}
		}
		if len(groups) == 1 && len(slow) == 0 {
			renew() // the usual case: one lease, no goroutine
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			renew()
		}()
	}
	for _, i := range slow {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = b.refreshSlow(ctx, rs[i], secs[i])
		}()
	}
	wg.Wait()

	// A deletion seen by the watch meanwhile wins over a renewed lease.
	b.mu.Lock()
	for ls, idx := range groups {
		for _, i := range idx {
			if h := hs[i]; errs[i] == nil && h.lease == ls && h.lost != nil {
				errs[i] = h.lost
			}
		}
	}
	b.mu.Unlock()
	return errs
}

// refreshSlow refreshes a lock that is not on the Backend's lease of its
// TTL: it reads the entry and either renews the entry's lease or moves the
// entry to the Backend's lease for sec.
func (b *Backend) refreshSlow(ctx context.Context, r dlock.Request, sec int64) error {
	start := time.Now()
	name, fence := b.nameOf(r.Key, r.Token), fenceRev(r.Fence)
	for range maxCAS {
		resp, err := b.cli.Get(ctx, name)
		if err != nil {
			return fmt.Errorf("etcdlock: refresh %q: %w", r.Key, err)
		}
		if len(resp.Kvs) == 0 || resp.Kvs[0].CreateRevision != fence {
			b.entryGone(name, fence, errNotHeld(r.Key))
			return errNotHeld(r.Key)
		}
		kv := resp.Kvs[0]
		b.mu.Lock()
		h := b.held[name]
		if h != nil && h.fence != fence {
			h = nil
		}
		b.mu.Unlock()
		if h == nil {
			// Not granted here: renew whatever lease the entry is on.
			return b.keepAlive(ctx, b.leaseFor(clientv3.LeaseID(kv.Lease)))
		}
		ls, err := b.lease(ctx, sec)
		if err != nil {
			return err
		}
		if kv.Lease != int64(ls.id) {
			tr, err := b.cli.Txn(ctx).
				If(clientv3.Compare(clientv3.CreateRevision(name), "=", fence),
					clientv3.Compare(clientv3.ModRevision(name), "=", kv.ModRevision)).
				Then(clientv3.OpPut(name, string(kv.Value), clientv3.WithLease(ls.id))).
				Commit()
			if isLeaseNotFound(err) {
				b.leaseGone(ls, fmt.Errorf("etcdlock: lease %x expired or was revoked: %w", int64(ls.id), dlock.ErrNotHeld))
				continue
			}
			if err != nil {
				return fmt.Errorf("etcdlock: refresh %q: %w", r.Key, err)
			}
			if !tr.Succeeded {
				continue
			}
			b.mu.Lock()
			if b.held[name] == h {
				h.lease = ls
				if tr.Header.Revision > h.mod {
					h.mod = tr.Header.Revision
				}
			}
			b.mu.Unlock()
		}
		return b.ensureFresh(ctx, ls, start, r.TTL)
	}
	return fmt.Errorf("etcdlock: refresh %q: the entry changed %d times in a row, giving up", r.Key, maxCAS)
}

// entryGone marks the granted entry name (at fence) lost.
func (b *Backend) entryGone(name string, fence int64, cause error) {
	b.mu.Lock()
	var lost lossList
	if h := b.held[name]; h != nil && h.fence == fence && !h.releasing {
		lost = b.markLostLocked(h, cause)
	}
	b.mu.Unlock()
	lost.fire()
}

// Release implements dlock.Backend: one transaction that deletes the
// owner's entry only if its create revision is still r.Fence, so a newer
// incarnation of the lock, or another owner's entry, is never touched
// (etcd issue #22082). A reentrant entry with a hold count above one has
// its count lowered instead (compare-and-swap on its mod revision). It
// returns an error matching dlock.ErrNotHeld, changing nothing, when the
// entry is gone or was created again since r.Fence. When the server
// cannot be reached and this was the Backend's last hold of the entry,
// the entry is deleted later: in the background, retried until the server
// answers, before the Backend queues on the same lock again, or by Close
// revoking the lease.
func (b *Backend) Release(ctx context.Context, r dlock.Request) error {
	if err := b.checkName(r); err != nil {
		return err
	}
	name, fence := b.nameOf(r.Key, r.Token), fenceRev(r.Fence)
	b.mu.Lock()
	h := b.held[name]
	if h != nil && h.fence != fence {
		h = nil
	}
	var count int
	var mod int64
	if h != nil {
		count, mod = int(h.count), h.mod
		if h.claims <= 1 {
			h.releasing = true // our own deletion is not a loss
		}
	}
	b.mu.Unlock()

	var (
		err     error
		deleted bool
		n       int
	)
	if r.Reentrant {
		n, mod, deleted, err = b.bump(ctx, name, r.Key, r.Token, fence, count, mod, -1)
	} else {
		err = b.deleteEntry(ctx, r.Key, name, fence)
		deleted = err == nil
	}
	gone := deleted || errors.Is(err, dlock.ErrNotHeld)

	b.mu.Lock()
	var lost lossList
	if h != nil && b.held[name] == h {
		h.claims--
		h.releasing = false
		switch {
		case err == nil && !deleted:
			if mod > h.mod {
				h.setCount(n, mod)
			}
		case gone && h.claims > 0:
			// The entry vanished under other holds of the same owner.
			lost = b.markLostLocked(h, errNotHeld(r.Key))
		case !gone && h.claims <= 0:
			b.orphanLocked(name, fence, 1)
			b.sweepLocked()
		}
		if gone || h.claims <= 0 {
			b.dropHoldLocked(h)
		}
	}
	b.mu.Unlock()
	lost.fire()
	return err
}

// orphanLocked records a claim on name (created at fence) to delete
// later. b.mu must be held.
func (b *Backend) orphanLocked(name string, fence int64, claims int) {
	o := b.orphans[name]
	if o.fence != fence {
		o = orphan{fence: fence}
	}
	o.claims += claims
	b.orphans[name] = o
}

// sweepLocked starts the background removal of the orphans unless it is
// running. It makes a pass over the orphans and, while some remain (the
// server unreachable), another after sweepMinDelay, doubling up to
// sweepMaxDelay (back to the minimum after a pass that removed one),
// until none remain or the Backend closes: an orphan on the Backend's
// lease would otherwise live as long as the Backend renews that lease for
// its other entries, and, heading a queue, stall it. b.mu must be held.
func (b *Backend) sweepLocked() {
	if b.sweeping || b.closed || len(b.orphans) == 0 {
		return
	}
	b.sweeping = true
	b.wg.Add(1)
	go b.sweepLoop()
}

// sweepLoop is the background removal started by sweepLocked.
func (b *Backend) sweepLoop() {
	defer b.wg.Done()
	delay := sweepMinDelay
	for {
		ctx, cancel := context.WithTimeout(b.ctx, cleanupTimeout)
		progress := b.removeOrphans(ctx, "")
		cancel()
		b.mu.Lock()
		if b.closed || len(b.orphans) == 0 {
			b.sweeping = false
			b.mu.Unlock()
			return
		}
		b.mu.Unlock()
		if progress {
			delay = sweepMinDelay
		}
		t := time.NewTimer(delay)
		select {
		case <-b.ctx.Done():
			t.Stop()
			b.mu.Lock()
			b.sweeping = false
			b.mu.Unlock()
			return
		case <-t.C:
		}
		delay = min(2*delay, sweepMaxDelay)
	}
}

// removeOrphans makes one attempt at removing each orphan whose name
// starts with dir ("": all) and that no other call is removing at the
// moment (a reentrant orphan's claims must be taken off its hold count
// once). It reports whether it removed any.
func (b *Backend) removeOrphans(ctx context.Context, dir string) (progress bool) {
	b.mu.Lock()
	todo := make(map[string]orphan)
	for name, o := range b.orphans {
		if _, busy := b.busy[name]; busy || !strings.HasPrefix(name, dir) {
			continue
		}
		todo[name] = o
		b.busy[name] = struct{}{}
	}
	b.mu.Unlock()
	for name, o := range todo {
		var err error
		if o.fence == 0 {
			err = b.deleteIfCreated(ctx, name, o.lease, o.value)
		} else {
			_, _, _, err = b.bump(ctx, name, name, "", o.fence, 0, 0, -o.claims)
		}
		done := err == nil || errors.Is(err, dlock.ErrNotHeld) || errors.Is(err, dlock.ErrWrongType)
		b.mu.Lock()
		delete(b.busy, name)
		if cur := b.orphans[name]; done && cur.fence == o.fence {
			if cur.claims -= o.claims; cur.claims <= 0 {
				delete(b.orphans, name)
			} else {
				b.orphans[name] = cur
			}
			progress = true
		}
		b.mu.Unlock()
	}
	return progress
}

// clearOrphans removes the Backend's orphans in the lock directory dir
// before it queues there (or tries to take the lock): such an orphan is
// usually the Backend's own entry whose release failed, and it would head
// the queue, on the lease the Backend keeps renewing while it waits. One
// attempt, bounded by ctx and abandonTimeout; the background sweep retries
// what remains.
func (b *Backend) clearOrphans(ctx context.Context, dir string) {
	b.mu.Lock()
	found := false
	for name := range b.orphans {
		if strings.HasPrefix(name, dir) {
			found = true
			break
		}
	}
	b.mu.Unlock()
	if !found {
		return
	}
	cctx, cancel := context.WithTimeout(ctx, abandonTimeout)
	defer cancel()
	b.removeOrphans(cctx, dir)
	b.mu.Lock()
	b.sweepLocked()
	b.mu.Unlock()
}

// Close implements dlock.Backend: it ends the Backend's watches and
// revokes its leases, which deletes every lock entry still attached to
// them (bounded by 5 s). Locks still held through the Backend are
// reported lost. Later calls fail with an error matching dlock.ErrClosed.
// The etcd client passed to New is not closed. Close returns the
// revocation errors, other than for leases already gone.
func (b *Backend) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	b.closed = true
	if b.reaper != nil {
		b.reaper.Stop()
		b.reaper = nil
	}
	var ids []clientv3.LeaseID
	for _, ls := range b.leases {
		if ls.isReady() && ls.err == nil && ls.dead == nil {
			ids = append(ids, ls.id)
		}
	}
	var lost lossList
	for _, h := range b.held {
		lost = append(lost, b.markLostLocked(h, fmt.Errorf("etcdlock: lock %q: backend closed: %w", h.key, dlock.ErrNotHeld))...)
	}
	b.mu.Unlock()
	lost.fire()
	b.cancel()
	b.wg.Wait()
	if b.cli == nil || len(ids) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	errs := make([]error, len(ids))
	var wg sync.WaitGroup
	for i, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := b.cli.Revoke(ctx, id); err != nil && !isLeaseNotFound(err) {
				errs[i] = fmt.Errorf("etcdlock: revoke lease %x: %w", int64(id), err)
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}
