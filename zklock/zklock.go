package zklock

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/go-zookeeper/zk"
)

// Backend is a dlock.Backend on one ZooKeeper session. It also implements
// dlock.BatchRefresher, Waiter, LossNotifier, Inspector, ForceReleaser,
// TTLLimiter, TTLFloor, KindSupporter (semaphores and read-write locks)
// and Proclaimer (leader election). It is safe for concurrent use; create it with
// New or Connect.
type Backend struct {
	conn  *zk.Conn
	cfg   config
	err   error // configuration error from New: every call fails with it
	owned bool  // made by Connect: Close closes conn

	// watchAhead: a waiter third or further in line also watches the node
	// before its predecessor (see waiter.watchAhead). Always on, except in
	// benchmarks that measure what it saves.
	watchAhead bool

	requested   time.Duration // Connect: the session timeout asked for, as sent (whole ms)
	negotiated  atomic.Int64  // Connect: negotiated session timeout (ns), 0 until known
	plainCreate atomic.Bool   // creates are plain, not multi-ops (see createOnce)
	czxids      zxidTable     // Connect: czxids of lock node creates, read off the wire
	gen         atomic.Uint32 // Connect: connections dialled (see wirewatch.go)

	born   time.Time       // for since
	ctx    context.Context // cancelled by Close; bounds background work
	cancel context.CancelFunc
	// cleanCtx bounds the clean-ups of leftover nodes (background): with
	// New, Close gives them up to a session timeout before it cancels it.
	cleanCtx    context.Context
	cleanCancel context.CancelFunc
	cleanWG     sync.WaitGroup
	armKick     chan struct{} // wakes the armer: a hold to watch was queued

	mu        sync.Mutex
	closed    bool
	holds     map[holdKey]*hold
	regID     uint64
	roomy     []*watchGroup // watch groups with room for another hold
	toArm     []*hold       // holds for the armer to watch, in armAt order
	arming    bool          // the armer runs
	rootOK    bool
	byPath    map[string]*hold    // Connect: holds by node path, for the events read off the wire
	reading   map[string]*armWire // Connect: wire-watching reads in flight, by path
	reapsKept int                 // scheduled reaps that found their hold claimed again
	wg        sync.WaitGroup      // watch groups, the armer, reapers and loss dispatches
}

var errClosed = fmt.Errorf("zklock: %w", dlock.ErrClosed)

// New returns a Backend on conn, whose session holds every lock the
// Backend takes; pass WithSessionTimeout (see its doc). New does not
// contact the server; an invalid option or a nil conn is recorded, Err
// returns it and every call fails with it. Close does not close conn.
func New(conn *zk.Conn, opts ...Option) *Backend {
	cfg := defaultConfig()
	b := newBackend(conn, cfg)
	if conn == nil {
		b.err = fmt.Errorf("zklock: %w: nil *zk.Conn", dlock.ErrInvalidOption)
		return b
	}
	if err := b.cfg.apply(opts); err != nil {
		b.err = err
	}
	return b
}

// Connect opens a ZooKeeper session to servers, requesting
// sessionTimeout, and returns the connection and a Backend that owns it
// (Backend.Close closes it, freeing its locks). Like zk.Connect it returns
// before the session is established. WithSessionTimeout is an
// ErrInvalidOption error here.
func Connect(servers []string, sessionTimeout time.Duration, opts ...Option) (*zk.Conn, *Backend, error) {
	cfg := defaultConfig()
	if err := cfg.apply(opts); err != nil {
		return nil, nil, err
	}
	if cfg.sessionTimeout != 0 {
		return nil, nil, fmt.Errorf("zklock: %w: WithSessionTimeout is for New; Connect learns the negotiated timeout", dlock.ErrInvalidOption)
	}
	if sessionTimeout <= 0 {
		return nil, nil, fmt.Errorf("zklock: %w: session timeout %v must be positive", dlock.ErrInvalidOption, sessionTimeout)
	}
	b := newBackend(nil, cfg)
	b.owned = true
	b.requested = sessionTimeout.Truncate(time.Millisecond) // go-zookeeper sends whole ms
	dial := cfg.dialer
	if dial == nil {
		dial = net.DialTimeout
	}
	userOpts := func(c *zk.Conn) {
		for _, o := range cfg.connOpts {
			o(c)
		}
	}
	sniffing := zk.WithDialer(func(network, addr string, timeout time.Duration) (net.Conn, error) {
		c, err := dial(network, addr, timeout)
		if err != nil {
			return nil, err
		}
		return newSniffConn(c, b, handshakeBound(sessionTimeout)), nil
	})
	var logger func(*zk.Conn) = func(*zk.Conn) {}
	if cfg.logger != nil {
		logger = zk.WithLogger(cfg.logger)
	}
	// Options are passed one by one: go-zookeeper's option type is
	// unexported, so a slice of them cannot be spelled here.
	conn, events, err := zk.Connect(servers, sessionTimeout, userOpts, sniffing, logger)
	if err != nil {
		b.cancel()
		return nil, nil, fmt.Errorf("zklock: connect: %w", err)
	}
	b.conn = conn
	go b.drainEvents(events) // ends when the connection is closed
	return conn, b, nil
}

func newBackend(conn *zk.Conn, cfg config) *Backend {
	ctx, cancel := context.WithCancel(context.Background())
	cleanCtx, cleanCancel := context.WithCancel(context.Background())
	return &Backend{
		born:        time.Now(),
		watchAhead:  true,
		conn:        conn,
		cfg:         cfg,
		ctx:         ctx,
		cancel:      cancel,
		cleanCtx:    cleanCtx,
		cleanCancel: cleanCancel,
		armKick:     make(chan struct{}, 1),
		holds:       make(map[holdKey]*hold),
		byPath:      make(map[string]*hold),
		reading:     make(map[string]*armWire),
	}
}

// since returns the time since the Backend was made, on the monotonic
// clock (a time.Time would make every hold 16 bytes larger).
func (b *Backend) since() time.Duration { return time.Since(b.born) }

// Err returns the configuration error recorded by New, or nil.
func (b *Backend) Err() error { return b.err }

// SessionTimeout returns the session timeout TTLs are checked against:
// with Connect, the value the server negotiated, or the requested one
// until the server has answered; with New, the one declared with
// WithSessionTimeout (0 when not declared).
func (b *Backend) SessionTimeout() time.Duration {
	if st := b.knownTimeout(); st > 0 {
		return st
	}
	return b.requested
}

// knownTimeout returns the declared (New) or negotiated (Connect) session
// timeout, 0 when there is none yet.
func (b *Backend) knownTimeout() time.Duration {
	if b.cfg.sessionTimeout > 0 {
		return b.cfg.sessionTimeout
	}
	return time.Duration(b.negotiated.Load())
}

// MaxTTL implements dlock.TTLLimiter: it returns SessionTimeout, the
// longest TTL a lease may have. It does not wait for the session (see
// "TTL and the session timeout" in the package documentation).
func (b *Backend) MaxTTL() time.Duration { return b.SessionTimeout() }

// KeyPath returns the znode under which the queue of key's lock nodes
// lives: the root path (WithPath) + "/" + the escaped key (see the package
// documentation). For operators and tests; it does not contact the server.
func (b *Backend) KeyPath(key string) string {
	return b.cfg.path + "/" + escapeKey(key)
}

// usable returns the error every call fails with, or nil.
func (b *Backend) usable() error {
	if b.err != nil {
		return b.err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return errClosed
	}
	return nil
}

// usableFor is usable for a call on key: it also refuses an invalid key.
func (b *Backend) usableFor(key string) error {
	if err := b.usable(); err != nil {
		return err
	}
	if err := dlock.ValidateKey(key); err != nil {
		return fmt.Errorf("zklock: %w", err)
	}
	return nil
}

// checkTTL refuses a TTL below MinTTL or above the session timeout. With
// Connect, before the first session is established it waits (bounded by
// ctx) for the server to answer, and checks against the negotiated value.
func (b *Backend) checkTTL(ctx context.Context, ttl time.Duration) error {
	if floor := b.MinTTL(); ttl < floor {
		return fmt.Errorf("zklock: %w: TTL %v is below zklock's minimum %v", dlock.ErrInvalidTTL, ttl, floor)
	}
	st := b.knownTimeout()
	if st == 0 && b.owned {
		if _, err := await(ctx, func() (string, error) { return b.conn.Sync("/") }); err != nil {
			return fmt.Errorf("zklock: waiting for the session: %w", err)
		}
		st = b.knownTimeout()
	}
	switch {
	case st == 0:
		return fmt.Errorf("zklock: %w: the session timeout is unknown, so no TTL is known to be safe: create the Backend with Connect, or pass WithSessionTimeout to New", dlock.ErrInvalidTTL)
	case ttl > st && b.owned && b.requested > st:
		return fmt.Errorf("zklock: %w: TTL %v is longer than the ZooKeeper session timeout %v (the server lowered the requested %v to its maxSessionTimeout)", dlock.ErrInvalidTTL, ttl, st, b.requested)
	case ttl > st:
		return fmt.Errorf("zklock: %w: TTL %v is longer than the ZooKeeper session timeout %v, which is all the server guarantees a lock node after the holder's last contact", dlock.ErrInvalidTTL, ttl, st)
	}
	return nil
}

// Close stops the Backend's goroutines and reports the locks it still
// holds lost to their NotifyLoss callbacks; with Connect it then closes
// the connection (the session's nodes go with it), with New it deletes
// them (up to a second each) and lets the clean-ups of leftover nodes
// still pending finish, for at most the session timeout. Later calls fail
// with dlock.ErrClosed. Close returns nil.
func (b *Backend) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	b.closed = true
	left := make([]*hold, 0, len(b.holds))
	for _, h := range b.holds {
		left = append(left, h)
	}
	b.mu.Unlock()
	b.cancel()
	b.wg.Wait()

	cause := fmt.Errorf("zklock: backend closed: %w", dlock.ErrNotHeld)
	for _, h := range left {
		b.loseHold(h, cause)
	}
	if b.conn == nil || b.owned {
		b.cleanCancel()
		b.cleanWG.Wait()
		if b.conn != nil {
			b.conn.Close()
		}
		return nil
	}
	// The session outlives the Backend: its nodes would block their keys
	// for as long as it lives.
	for _, h := range left {
		b.cleanWG.Add(1)
		go func() {
			defer b.cleanWG.Done()
			ctx, cancel := context.WithTimeout(b.cleanCtx, abandonTimeout)
			defer cancel()
			_ = b.delete(ctx, h.path)
		}()
	}
	done := make(chan struct{})
	go func() {
		b.cleanWG.Wait()
		close(done)
	}()
	t := time.NewTimer(max(abandonTimeout, b.SessionTimeout()))
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		b.cleanCancel()
		<-done
	}
	b.cleanCancel()
	return nil
}

// zkErr wraps a go-zookeeper error with what was being done.
func zkErr(op, key string, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) ||
		strings.HasPrefix(err.Error(), "zklock: ") {
		return err // the context's own error, or already described
	}
	return fmt.Errorf("zklock: %s %q: %w", op, key, err)
}

// minTTL is the shortest TTL zklock accepts (see MinTTL).
const minTTL = 100 * time.Millisecond

// MinTTL implements dlock.TTLFloor: it returns the shortest TTL a lease
// may have, 100ms. Shorter leases are refused with an error matching
// dlock.ErrInvalidTTL (the measurement behind the value is in the package
// documentation).
func (b *Backend) MinTTL() time.Duration { return minTTL }
