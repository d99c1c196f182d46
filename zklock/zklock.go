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

// Backend is a dlock.Backend on one ZooKeeper session: the *zk.Conn given
// to New or made by Connect. It implements dlock.Backend,
// dlock.BatchRefresher, dlock.Waiter (a FIFO queue, its only waiting
// mode), dlock.LossNotifier, dlock.Inspector and dlock.ForceReleaser. It is
// safe for concurrent use. Create it with New or Connect; the zero value
// is not usable.
type Backend struct {
	conn  *zk.Conn
	cfg   config
	err   error // configuration error from New: every call fails with it
	owned bool  // made by Connect: Close closes conn

	negotiated  atomic.Int64  // Connect: negotiated session timeout (ns), 0 until known
	plainCreate atomic.Bool   // creates are plain, not multi-ops (see createOnce)
	czxids      zxidTable     // Connect: czxids of lock node creates, read off the wire
	gen         atomic.Uint32 // Connect: connections dialled (see wirewatch.go)

	born    time.Time       // for since
	ctx     context.Context // cancelled by Close; bounds background work
	cancel  context.CancelFunc
	armKick chan struct{} // wakes the armer: a hold to watch was queued

	mu      sync.Mutex
	closed  bool
	holds   map[holdKey]*hold
	regID   uint64
	roomy   []*watchGroup // watch groups with room for another hold
	toArm   []*hold       // holds for the armer to watch, in armAt order
	arming  bool          // the armer runs
	rootOK  bool
	byPath  map[string]*hold    // Connect: holds by node path, for the events read off the wire
	reading map[string]*armWire // Connect: wire-watching reads in flight, by path
	wg      sync.WaitGroup      // watch groups, the armer, reapers and loss dispatches
}

var errClosed = fmt.Errorf("zklock: %w", dlock.ErrClosed)

// New returns a Backend on conn, whose session holds every lock the
// Backend takes. Pass WithSessionTimeout with the session timeout the
// server negotiated for conn: go-zookeeper does not expose it, and without
// it every acquisition fails with an error matching dlock.ErrInvalidTTL
// (Connect needs no such option). New does not contact the server. An
// invalid option, or a nil conn, is recorded: Err returns it and every
// call fails with it. Close does not close conn.
//
// Like a Backend from Connect, it learns of a lost lock from a watch on
// each held node (which reports the node's deletion, and the session's
// expiry once the connection is re-established) and from Refresh; it needs
// none of the connection's session events. Its watches are go-zookeeper's
// (a Backend from Connect keeps its own, at less memory per held lock:
// see the package documentation).
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

// Connect opens a ZooKeeper session to servers with the requested
// sessionTimeout (like zk.Connect, it returns before the session is
// established) and returns the connection and a Backend on it that owns
// it: Backend.Close closes the connection, which ends the session and
// deletes the lock nodes still held. Connect learns the session timeout
// the server negotiates (ZooKeeper clamps it to 2–20 × tickTime by
// default) from the handshake, on every (re)connection, and checks every
// TTL against it. The connection may be used for other purposes too.
// Options WithLogger, WithDialer and WithConnOptions configure the
// connection; WithSessionTimeout is an ErrInvalidOption error here.
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
	return &Backend{
		born:    time.Now(),
		conn:    conn,
		cfg:     cfg,
		ctx:     ctx,
		cancel:  cancel,
		armKick: make(chan struct{}, 1),
		holds:   make(map[holdKey]*hold),
		byPath:  make(map[string]*hold),
		reading: make(map[string]*armWire),
	}
}

// since returns the time since the Backend was made, on the monotonic
// clock (a time.Time would make every hold 16 bytes larger).
func (b *Backend) since() time.Duration { return time.Since(b.born) }

// Err returns the configuration error recorded by New, or nil.
func (b *Backend) Err() error { return b.err }

// SessionTimeout returns the session timeout TTLs are checked against:
// the value negotiated with the server (Connect; 0 until the first session
// is established) or the one declared with WithSessionTimeout (New; 0 when
// not declared).
func (b *Backend) SessionTimeout() time.Duration {
	if b.cfg.sessionTimeout > 0 {
		return b.cfg.sessionTimeout
	}
	return time.Duration(b.negotiated.Load())
}

// MaxTTL implements dlock.TTLLimiter: a lease cannot outlive the session
// timeout, so a dlock Client created without WithTTL uses it as its TTL.
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

// checkTTL refuses a TTL longer than the session timeout. With Connect,
// before the first session is established it waits (bounded by ctx) for
// the server to answer once, which fixes the negotiated value.
func (b *Backend) checkTTL(ctx context.Context, ttl time.Duration) error {
	if ttl < dlock.MinTTL {
		return fmt.Errorf("zklock: %w: %v is below the minimum %v", dlock.ErrInvalidTTL, ttl, dlock.MinTTL)
	}
	st := b.SessionTimeout()
	if st == 0 && b.owned {
		if _, err := await(ctx, func() (string, error) { return b.conn.Sync("/") }); err != nil {
			return fmt.Errorf("zklock: waiting for the session: %w", err)
		}
		st = b.SessionTimeout()
	}
	switch {
	case st == 0:
		return fmt.Errorf("zklock: %w: the session timeout is unknown, so no TTL is known to be safe: create the Backend with Connect, or pass WithSessionTimeout to New", dlock.ErrInvalidTTL)
	case ttl > st:
		return fmt.Errorf("zklock: %w: TTL %v is longer than the ZooKeeper session timeout %v, which is all the server guarantees a lock node after the holder's last contact", dlock.ErrInvalidTTL, ttl, st)
	}
	return nil
}

// Close stops the Backend's watch goroutines and background clean-up. Locks it
// still holds (the dlock Client releases its leases before closing its
// backend) are reported lost to NotifyLoss callbacks. With Connect, Close
// then closes the connection, which ends the session and so deletes those
// lock nodes; with New, it deletes them itself (bounded by one second
// each) and leaves conn open. Later calls fail with an error matching
// dlock.ErrClosed. Close always returns nil and may be called again.
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
	if b.conn == nil {
		return nil
	}
	if b.owned {
		b.conn.Close()
		return nil
	}
	var wg sync.WaitGroup
	for _, h := range left {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), abandonTimeout)
			defer cancel()
			_, _ = await(ctx, func() (struct{}, error) { return struct{}{}, b.conn.Delete(h.path, -1) })
		}()
	}
	wg.Wait()
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
