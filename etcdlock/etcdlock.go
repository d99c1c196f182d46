package etcdlock

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/ctxend"
)

const (
	// MinTTL is the shortest lock TTL the Backend accepts (etcd's
	// minimum lease TTL with its default election timeout); a shorter
	// Request.TTL fails with an error matching dlock.ErrInvalidTTL.
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

// Backend is a dlock.Backend on an etcd cluster, with the optional
// capabilities asserted below. Create it with New; it is safe for
// concurrent use.
type Backend struct {
	cli     *clientv3.Client
	prefix  string
	err     error              // configuration error from New
	ctx     context.Context    // the Backend's lifetime: cancelled by Close
	cancel  context.CancelFunc //
	waitCtx context.Context    // ctx, requiring a leader: the waiters' watch stream
	id      string             // random: names the entries of non-reentrant requests (keys.go)
	tune    tuning             // protocol switches and timings (tuning.go)

	// mu guards closed and the parts below, each in the file named for
	// it; one mutex, because operations span parts atomically (a lease
	// retired marks its holds lost; a slot is free only if no hold or
	// orphan uses its name).
	mu      sync.Mutex
	closed  bool
	leases  leaseSet    // etcd leases (lease.go)
	holds   holdSet     // granted entries and their loss watches (held.go, prefixwatch.go)
	names   nameSet     // entry names of non-reentrant requests (keys.go)
	orphans orphanSet   // entries to delete in the background (orphans.go)
	waits   waitWatches // the waiters' entry watches (entrywatch.go)
	kinds   kindNames   // entry names of permit and read holds (kind.go)
	wg      sync.WaitGroup
}

var (
	_ dlock.Backend        = (*Backend)(nil)
	_ dlock.BatchRefresher = (*Backend)(nil)
	_ dlock.Waiter         = (*Backend)(nil)
	_ dlock.LossNotifier   = (*Backend)(nil)
	_ dlock.TTLFloor       = (*Backend)(nil)
)

// New returns a Backend on the etcd cluster of cli, configured by opts.
// It does not contact the server, nor close cli on Close. If cli is nil
// or an option is invalid, every call fails with that error, which Err
// returns.
func New(cli *clientv3.Client, opts ...Option) *Backend {
	ctx, cancel := context.WithCancel(context.Background())
	b := &Backend{
		cli:     cli,
		tune:    defaultTuning(),
		prefix:  DefaultPrefix,
		ctx:     ctx,
		cancel:  cancel,
		waitCtx: clientv3.WithRequireLeader(ctx),
		id:      rand.Text(),
		leases:  leaseSet{shared: make(map[int64]*leaseState), spare: make(map[int64]*leaseState)},
		holds:   holdSet{byName: make(map[string]*held), watching: make(map[*held]struct{}), kick: make(chan struct{}, 1)},
		names:   nameSet{slots: make(map[string]*slot), wide: make(map[string]int)},
		orphans: orphanSet{byName: make(map[string]orphan), busy: make(map[string]struct{})},
		waits:   waitWatches{entries: make(map[string]*entryWatch)},
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

// rpcErr returns ctx's error if ctx ended, else err: a call cut short by
// its context matches the context's error, whatever gRPC or the server
// made of it (the server may see the deadline pass before the client:
// "etcdserver: request timed out").
func rpcErr(ctx context.Context, err error) error {
	if ctxErr := ctxend.Err(ctx); ctxErr != nil {
		return ctxErr
	}
	return err
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

// startLocked runs loop on a goroutine counted in b.wg unless *running
// says it runs, and sets *running. b.mu must be held.
func (b *Backend) startLocked(running *bool, loop func()) {
	if *running {
		return
	}
	*running = true
	b.wg.Add(1)
	go loop()
}

// Close implements dlock.Backend: it ends the Backend's watches, takes
// back its holds of owners' entries and revokes its shared leases (which
// deletes their entries), within 5 s; locks still held are reported lost.
// The etcd client is not closed. Later calls fail with dlock.ErrClosed.
func (b *Backend) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	b.closed = true
	if b.waits.reaper != nil {
		b.waits.reaper.Stop()
		b.waits.reaper = nil
	}
	var ids []clientv3.LeaseID
	for _, ls := range b.leases.shared {
		if ls.isReady() && ls.err == nil && ls.dead == nil {
			ids = append(ids, ls.id)
		}
	}
	for _, ls := range b.leases.spare {
		ids = append(ids, ls.id)
	}
	var lost lossList
	owned := false
	for _, h := range b.holds.byName {
		if (h.lease.private || h.lease.foreign) && h.claims > 0 && !h.releasing {
			// An owner's entry other Backends may hold too: take back
			// only this Backend's holds.
			b.orphanLocked(h.name, h.fence, int(h.claims))
			owned = true
		}
		lost = append(lost, b.markLostLocked(h, fmt.Errorf("etcdlock: lock %q: backend closed: %w", h.key, dlock.ErrNotHeld))...)
	}
	b.mu.Unlock()
	lost.fire()
	b.cancel()
	b.wg.Wait()
	if b.cli == nil || (len(ids) == 0 && !owned) {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	if owned {
		b.removeOrphans(ctx, "")
	}
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
