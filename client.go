package dlock

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/dlock-go/dlock/internal/ctxend"
)

// A Client takes locks on one Backend and holds all policy: how to wait,
// when to renew, how to report a lost lease. Create one per backend and
// share it; it is safe for concurrent use. One watchdog goroutine renews
// all of a Client's leases (it runs only while leases are held).
type Client struct {
	b   Backend
	cfg config
	err error // from New: returned by every call

	batch    BatchRefresher
	notifier Notifier
	waiter   Waiter
	loss     LossNotifier
	limiter  TTLLimiter
	floor    TTLFloor
	readers  bool // the backend has read holds: waiting writers keep readers out
	tryFirst bool // the backend's plain attempt is cheap when held (QueueTrier)

	mu        sync.Mutex
	closed    bool
	closing   <-chan struct{} // closeCtx.Done(): closed by Close, ends waits
	closeCtx  context.Context
	stopAll   context.CancelFunc
	acquiring sync.WaitGroup
	leases    map[*Lease]struct{}
	owned     map[ownerKey]*holdGroup
	pending   map[*time.Timer]struct{} // releases due at the end of a minimum hold
	hot       map[string]time.Time     // keys waited for in a queue lately, until when
	renew     leaseHeap                // auto-renewed leases by next renewal
	expiry    leaseHeap                // other leases by expiry
	timer     *time.Timer              // runs tick; see watchdog.go
	timerAt   time.Time                // when timer fires; zero when not pending
	batches   sync.WaitGroup
}

// New returns a Client taking locks on b, configured by opts. New does
// not contact the server. If b is nil or an option is invalid, the Client
// is still returned but every call on it fails with that error, which Err
// also returns: check Err once at start-up.
func New(b Backend, opts ...Option) *Client {
	c := &Client{
		b:       b,
		cfg:     defaultConfig(),
		leases:  make(map[*Lease]struct{}),
		owned:   make(map[ownerKey]*holdGroup),
		pending: make(map[*time.Timer]struct{}),
		hot:     make(map[string]time.Time),
	}
	c.closeCtx, c.stopAll = context.WithCancel(context.Background())
	c.closing = c.closeCtx.Done()
	c.renew.at = func(l *Lease) time.Time { return l.next }
	c.renew.idx = func(l *Lease) *int { return &l.renewIdx }
	c.expiry.at = func(l *Lease) time.Time { return l.expAt }
	c.expiry.idx = func(l *Lease) *int { return &l.expIdx }
	if b == nil {
		c.err = fmt.Errorf("%w: nil Backend", ErrInvalidOption)
		return c
	}
	if ks, ok := b.(KindSupporter); ok {
		c.readers = ks.SupportsKind(KindRead)
	}
	if qt, ok := b.(QueueTrier); ok {
		c.tryFirst = qt.TryBeforeQueue()
	}
	c.limiter, _ = b.(TTLLimiter)
	c.floor, _ = b.(TTLFloor)
	c.err = c.cfg.apply(opts)
	if c.err == nil && c.cfg.ttlSet {
		c.err = c.checkFloor(c.cfg.ttl)
	}
	c.batch, _ = b.(BatchRefresher)
	c.notifier, _ = b.(Notifier)
	c.waiter, _ = b.(Waiter)
	c.loss, _ = b.(LossNotifier)
	return c
}

// Err returns the configuration error recorded by New, or nil; for a
// nil Client or one not created with New, an ErrInvalidOption error.
func (c *Client) Err() error { return c.usable() }

// usable returns the error that makes c unusable: nil, not created with
// New, or New's configuration error.
func (c *Client) usable() error {
	switch {
	case c == nil:
		return fmt.Errorf("%w: nil Client", ErrInvalidOption)
	case c.closeCtx == nil:
		return fmt.Errorf("%w: Client not created with New", ErrInvalidOption)
	}
	return c.err
}

// Backend returns the backend the Client was created with (nil for a nil
// Client).
func (c *Client) Backend() Backend {
	if c == nil {
		return nil
	}
	return c.b
}

// Acquire takes the lock key, waiting while another owner holds it as the
// wait strategy (WithWait) allows. ctx bounds only the wait, not the
// lease. On success it returns a held Lease, renewed by the watchdog
// unless WithAutoRenew(false). If the wait ends without the lock it
// returns an *AcquireError matching ErrNotAcquired, and also ctx's error
// when ctx ended it. Server failures are returned as they are, wrapped
// with the key. opts override the Client's options for this call.
func (c *Client) Acquire(ctx context.Context, key string, opts ...Option) (*Lease, error) {
	return c.acquire(ctx, key, opts, false)
}

// TryAcquire makes exactly one attempt to take the lock key. When the
// lock is held by another owner it returns an *AcquireError matching
// ErrNotAcquired (never waiting); otherwise it behaves like Acquire.
func (c *Client) TryAcquire(ctx context.Context, key string, opts ...Option) (*Lease, error) {
	return c.acquire(ctx, key, opts, true)
}

// Do acquires key, runs fn with a context that is cancelled (cause
// ErrLost) if the lease is lost, and releases the lease when fn returns or
// panics, even if ctx was cancelled meanwhile: the release runs with a
// fresh context bounded by WithReleaseTimeout (default 5s). A panic in fn
// is re-raised after the release. Do returns the Acquire error, or fn's
// error joined with the release error; a lease lost while fn ran makes the
// result match ErrLost even when fn returned nil.
func (c *Client) Do(ctx context.Context, key string, fn func(ctx context.Context, l *Lease) error, opts ...Option) (err error) {
	if fn == nil {
		return wrapOp("do", key, fmt.Errorf("%w: nil function", ErrInvalidOption))
	}
	l, err := c.Acquire(ctx, key, opts...)
	if err != nil {
		return err
	}
	work, cancel := l.Context(ctx)
	defer func() {
		cancel()
		rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), l.releaseTimeout)
		defer rcancel()
		err = errors.Join(err, l.Release(rctx))
	}()
	return fn(work, l)
}

// Close ends the Client: waits in progress end with ErrClosed, acquisitions
// already at the server finish (a grant that arrives is given back), every
// lease still held is released (each bounded by the release timeout), the
// watchdog stops and the backend's own resources are closed (not clients
// passed to the backend by the caller). Calls after Close fail with
// ErrClosed. Close returns the errors of releases that failed for a reason
// other than the lease being lost.
func (c *Client) Close() error {
	if c == nil || c.closeCtx == nil {
		return c.usable()
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	c.stopAll()
	c.mu.Unlock()

	// Acquisitions in flight see closed when their answer comes and give
	// a grant back while the backend is still open. A server that does
	// not answer is waited for at most the release timeout.
	done := make(chan struct{})
	go func() { c.acquiring.Wait(); close(done) }()
	t := time.NewTimer(c.cfg.releaseTimeout)
	select {
	case <-done:
	case <-t.C:
	}
	t.Stop()

	c.mu.Lock()
	held := make([]*Lease, 0, len(c.leases))
	for l := range c.leases {
		held = append(held, l)
	}
	c.mu.Unlock()
	var errs []error
	for _, l := range held {
		ctx, cancel := context.WithTimeout(context.Background(), c.cfg.releaseTimeout)
		if err := l.closeRelease(ctx); err != nil {
			errs = append(errs, err)
		}
		cancel()
	}
	c.mu.Lock()
	if c.timer != nil {
		c.timer.Stop()
	}
	// Locks still in their minimum hold expire by themselves.
	for t := range c.pending {
		t.Stop()
	}
	clear(c.pending)
	c.mu.Unlock()
	c.batches.Wait()
	if c.b != nil {
		if err := c.b.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// ValidateKey reports whether key can name a lock: 1 to MaxKeyLen bytes.
func ValidateKey(key string) error {
	if key == "" {
		return fmt.Errorf("%w: empty key", ErrInvalidKey)
	}
	if len(key) > MaxKeyLen {
		return fmt.Errorf("%w: key is %d bytes, the limit is %d", ErrInvalidKey, len(key), MaxKeyLen)
	}
	return nil
}

func (c *Client) acquire(ctx context.Context, key string, opts []Option, once bool) (*Lease, error) {
	return c.acquireKind(ctx, key, KindLock, 0, opts, once)
}

// acquireKind takes a hold of kind k (permits for KindPermit) on key.
func (c *Client) acquireKind(ctx context.Context, key string, k Kind, permits int, opts []Option, once bool) (*Lease, error) {
	if err := c.usable(); err != nil {
		return nil, wrapOp("acquire", key, err)
	}
	if ctx == nil {
		return nil, wrapOp("acquire", key, fmt.Errorf("%w: nil context", ErrInvalidOption))
	}
	if err := ValidateKey(key); err != nil {
		return nil, wrapOp("acquire", shorten(key), err)
	}
	cfg := c.cfg
	if err := cfg.apply(opts); err != nil {
		return nil, wrapOp("acquire", key, err)
	}
	if err := c.effectiveTTL(&cfg); err != nil {
		return nil, wrapOp("acquire", key, err)
	}
	if err := c.checkKind(k, permits, &cfg); err != nil {
		return nil, wrapOp("acquire", key, err)
	}
	if once {
		cfg.wait = NoWait()
	}
	if cfg.fifo && c.waiter == nil {
		return nil, wrapOp("acquire", key, fmt.Errorf("%w: WithFIFO: backend %T has no server-side queue", ErrInvalidOption, c.b))
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, wrapOp("acquire", key, ErrClosed)
	}
	c.acquiring.Add(1)
	c.mu.Unlock()
	defer c.acquiring.Done()

	req := Request{Key: key, TTL: cfg.ttl, FIFO: cfg.fifo, Token: c.token(cfg), Reentrant: cfg.owner != "", Kind: k, Permits: permits, Value: cfg.value}
	if _, waits := cfg.wait.Delay(1); waits && k == KindLock && c.readers {
		req.Waiting = true
	}
	if len(cfg.observers) == 0 {
		return c.acquireAs(ctx, req, cfg, once)
	}
	start := time.Now()
	ctx = observe(ctx, cfg.observers, Event{Kind: EventAcquireStart, Key: key})
	l, err := c.acquireAs(ctx, req, cfg, once)
	observe(ctx, cfg.observers, Event{Kind: EventAcquireEnd, Key: key, Lease: l, Err: err, Duration: time.Since(start)})
	return l, err
}

// acquireAs takes the lock for an owner (joining its holds) or a new token.
func (c *Client) acquireAs(ctx context.Context, req Request, cfg config, once bool) (*Lease, error) {
	if req.Reentrant {
		return c.acquireOwned(ctx, req, cfg, once)
	}
	return c.acquireWait(ctx, req, cfg)
}

func (c *Client) acquireWait(ctx context.Context, req Request, cfg config) (*Lease, error) {
	// The server-side queue serves FIFO requests, and every wait on a
	// backend that cannot notify releases (the queue is how it waits).
	if _, waits := cfg.wait.Delay(1); waits && c.waiter != nil && (req.FIFO || c.notifier == nil) {
		tried := 0
		if !req.FIFO && c.tryFirst && !c.contended(req.Key) {
			// A key nobody queued for lately: one plain attempt first, on
			// the caller's context (a queue wait needs one Close can end,
			// which costs the backend more), and the queue only if it
			// is held.
			invoke := time.Now()
			g, err := c.b.TryAcquire(ctx, req)
			if len(cfg.observers) > 0 {
				observe(ctx, cfg.observers, Event{Kind: EventAttempt, Key: req.Key, Attempt: 1, Granted: g.OK, HolderTTL: g.HolderTTL, Err: err})
			}
			switch {
			case err != nil && ctxend.Ended(ctx):
				return nil, ctxAcquireError(req.Key, 1, ctx, err)
			case err != nil:
				return nil, wrapOp("acquire", req.Key, err)
			case g.OK:
				return c.grant(ctx, req, g, invoke, cfg, 1)
			}
			tried = 1
		}
		c.markContended(req.Key)
		l, err, fallback := c.acquireQueued(ctx, req, cfg, tried)
		if !fallback {
			return l, err
		}
	}
	return c.acquireLoop(ctx, req, cfg)
}

// contendedFor is how long a key stays marked contended after a queue
// wait for it: acquisitions of a contended key join the queue at once.
const contendedFor = 2 * time.Second

// contended reports whether key was waited for in a queue lately.
func (c *Client) contended(key string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	t, ok := c.hot[key]
	return ok && time.Now().Before(t)
}

// markContended records a queue wait for key.
func (c *Client) markContended(key string) {
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.hot) >= 4096 {
		for k, t := range c.hot {
			if !now.Before(t) {
				delete(c.hot, k)
			}
		}
	}
	if len(c.hot) < 8192 {
		c.hot[key] = now.Add(contendedFor)
	}
}

// token is the owner id, or a new random token.
func (c *Client) token(cfg config) string {
	if cfg.owner != "" {
		return cfg.owner
	}
	return rand.Text()
}

// acquireLoop tries, and between tries waits for a release notification,
// the holder's remaining TTL or the strategy's delay, whichever is first.
// attempt counts the strategy's attempts; the retry right after a new
// subscription (a release may have come before it) is not one of them.
func (c *Client) acquireLoop(ctx context.Context, req Request, cfg config) (*Lease, error) {
	var (
		sub       <-chan struct{}
		stopSub   func()
		subFailed bool
		timer     *time.Timer
		calls     int
	)
	granted := false
	defer func() {
		if stopSub != nil {
			stopSub()
		}
		if timer != nil {
			timer.Stop()
			c.setWaiting(cfg.group, false)
			observe(ctx, cfg.observers, Event{Kind: EventWaitEnd, Key: req.Key})
		}
		if req.Waiting && !granted {
			c.withdraw(ctx, req, cfg)
		}
	}()
	for attempt := 1; ; attempt++ {
		calls++
		invoke := time.Now()
		g, err := c.b.TryAcquire(ctx, req)
		if len(cfg.observers) > 0 {
			observe(ctx, cfg.observers, Event{Kind: EventAttempt, Key: req.Key, Attempt: calls, Granted: g.OK, HolderTTL: g.HolderTTL, Err: err})
		}
		if err != nil {
			if ctxend.Ended(ctx) {
				return nil, ctxAcquireError(req.Key, attempt, ctx, err)
			}
			return nil, wrapOp("acquire", req.Key, err)
		}
		if g.OK {
			granted = true
			return c.grant(ctx, req, g, invoke, cfg, attempt)
		}
		d, ok := cfg.wait.Delay(attempt)
		if !ok {
			return nil, &AcquireError{Key: req.Key, Attempts: attempt}
		}
		if c.notifier != nil {
			if sub == nil && !subFailed {
				// Subscribe, then retry at once: a release between the failed
				// attempt and the subscription would otherwise be missed. A
				// failed subscription only costs promptness: the wait below is
				// bounded by the holder's TTL and the strategy anyway.
				sub, stopSub, err = c.notifier.Subscribe(ctx, req.Key)
				if err == nil {
					attempt--
					continue
				}
				if ctxend.Ended(ctx) {
					return nil, ctxAcquireError(req.Key, attempt, ctx, err)
				}
				sub, stopSub, subFailed = nil, nil, true
			}
			if g.HolderTTL > 0 {
				d = min(d, g.HolderTTL)
			}
		}
		if timer == nil {
			c.setWaiting(cfg.group, true)
			observe(ctx, cfg.observers, Event{Kind: EventWaitStart, Key: req.Key})
			timer = time.NewTimer(d)
		} else {
			timer.Reset(d)
		}
		select {
		case <-ctx.Done():
			return nil, ctxAcquireError(req.Key, attempt, ctx, nil)
		case <-c.closing:
			return nil, wrapOp("acquire", req.Key, ErrClosed)
		case <-sub:
		case <-timer.C:
		}
	}
}

// acquireQueued waits in the backend's server-side queue, bounded by the
// strategy's patience. fallback reports that the backend offers no queue
// for this request (errors.ErrUnsupported) and the retry loop must be used.
// tried counts the attempts made before (reported as the attempts so far).
func (c *Client) acquireQueued(ctx context.Context, req Request, cfg config, tried int) (l *Lease, err error, fallback bool) {
	wctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := context.AfterFunc(c.closeCtx, func() { cancel(ErrClosed) })
	defer stop()
	if p, finite := patience(cfg.wait); finite {
		var cancelT context.CancelFunc
		wctx, cancelT = context.WithTimeout(wctx, p)
		defer cancelT()
	}
	invoke := time.Now()
	c.setWaiting(cfg.group, true)
	observe(ctx, cfg.observers, Event{Kind: EventWaitStart, Key: req.Key})
	g, err := c.waiter.Wait(wctx, req)
	c.setWaiting(cfg.group, false)
	if errors.Is(err, errors.ErrUnsupported) && !req.FIFO {
		observe(ctx, cfg.observers, Event{Kind: EventWaitEnd, Key: req.Key})
		return nil, nil, true
	}
	// As in the retry loop: the last attempt, then the end of the wait.
	observe(ctx, cfg.observers, Event{Kind: EventAttempt, Key: req.Key, Attempt: tried + 1, Granted: err == nil && g.OK, Err: err})
	observe(ctx, cfg.observers, Event{Kind: EventWaitEnd, Key: req.Key})
	switch {
	case err == nil && g.OK:
		if !g.Since.IsZero() {
			invoke = g.Since
		}
		switch {
		case g.TTL > 0 && g.TTL < req.TTL && !cfg.autoRenew,
			g.Since.IsZero() && time.Since(invoke) > req.TTL/3:
			// A lock handed over but not confirmed yet, and no watchdog
			// renewal to confirm it. Or a long queue wait and no word from
			// the backend on when the lock's lifetime started. Either way,
			// renew it now to know.
			r := req
			r.Fence = g.Fence
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.releaseTimeout)
			invoke = time.Now()
			if rerr := c.b.Refresh(rctx, r); rerr != nil {
				_ = c.b.Release(rctx, r)
				cancel()
				return nil, wrapOp("acquire", req.Key, rerr), false
			}
			cancel()
			g.TTL = 0
		}
		l, err := c.grant(ctx, req, g, invoke, cfg, tried+1)
		return l, err, false
	case ctxend.Ended(ctx):
		return nil, ctxAcquireError(req.Key, tried+1, ctx, err), false
	case errors.Is(context.Cause(wctx), ErrClosed):
		return nil, wrapOp("acquire", req.Key, ErrClosed), false
	case ctxend.Ended(wctx) || err == nil:
		return nil, &AcquireError{Key: req.Key, Attempts: tried + 1}, false
	default:
		return nil, wrapOp("acquire", req.Key, err), false
	}
}

// withdraw tells the backend that a writer stopped waiting, so that
// readers it kept out may enter at once (Release with Waiting set).
func (c *Client) withdraw(ctx context.Context, req Request, cfg config) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.releaseTimeout)
	defer cancel()
	r := req
	r.Fence = 0
	_ = c.b.Release(rctx, r)
}

// newLease builds the Lease of a grant made at invoke; it is not tracked.
func (c *Client) newLease(req Request, g Grant, invoke time.Time, cfg config) *Lease {
	req.Fence = g.Fence
	if !g.Since.IsZero() {
		invoke = g.Since // the backend counts the lock's lifetime from there
	}
	valid := req.TTL // the lock's lifetime from invoke
	if g.TTL > 0 && g.TTL < req.TTL {
		valid = g.TTL
	}
	return &Lease{
		c:              c,
		req:            req,
		count:          max(g.Count, 1),
		created:        invoke,
		ttl:            req.TTL,
		valid:          valid,
		expires:        invoke.Add(valid - drift(valid)),
		done:           make(chan struct{}),
		autoRenew:      cfg.autoRenew,
		onLost:         cfg.onLost,
		observers:      cfg.observers,
		releaseTimeout: cfg.releaseTimeout,
		minHold:        cfg.minHold,
		maxHold:        cfg.maxHold,
		renewIdx:       -1,
		expIdx:         -1,
	}
}

// grant turns a successful server attempt into a tracked Lease, or gives
// the lock back when it cannot be used (expired already, Client closed).
func (c *Client) grant(ctx context.Context, req Request, g Grant, invoke time.Time, cfg config, attempts int) (*Lease, error) {
	l := c.newLease(req, g, invoke, cfg)
	giveBack := func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.releaseTimeout)
		_ = c.b.Release(rctx, l.req)
		cancel()
	}
	if !time.Now().Before(l.expires) {
		// The grant took longer than the lease's validity: it may already
		// have expired on the server. Give it back and report it.
		giveBack()
		return nil, &AcquireError{Key: req.Key, Attempts: attempts, Cause: fmt.Errorf("the grant took longer than the TTL %v", req.TTL)}
	}
	if g.TTL > 0 && g.TTL < req.TTL && !cfg.autoRenew {
		// Granted for less than asked, and no watchdog renewal to make up
		// for it: renew once now, as Grant.TTL says.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.releaseTimeout)
		r := l.req
		rinvoke := time.Now()
		err := c.b.Refresh(rctx, r)
		cancel()
		if err != nil {
			giveBack()
			return nil, wrapOp("acquire", req.Key, err)
		}
		l.created, l.valid = rinvoke, req.TTL
		l.expires = rinvoke.Add(req.TTL - drift(req.TTL))
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		giveBack()
		return nil, wrapOp("acquire", req.Key, ErrClosed)
	}
	c.leases[l] = struct{}{}
	if req.Reentrant {
		k := ownerKey{req.Key, req.Token}
		gr := c.owned[k]
		if gr == nil {
			gr = &holdGroup{gate: make(chan struct{}, 1)}
			c.owned[k] = gr
		}
		gr.holds = append(gr.holds, l)
	}
	c.track(l)
	c.mu.Unlock()
	c.watchLoss(l)
	l.limitHold()
	return l, nil
}

// releaseAt gives r's lock back at t, unless the Client closes first
// (then the lock expires by itself), and then calls stop (the lease's
// loss registration, if it was kept for the release; nil: none).
func (c *Client) releaseAt(r Request, t time.Time, timeout time.Duration, stop func()) {
	if stop == nil {
		stop = func() {}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		go stop()
		return
	}
	var tm *time.Timer
	tm = time.AfterFunc(time.Until(t), func() {
		defer stop()
		c.mu.Lock()
		if _, ok := c.pending[tm]; !ok || c.closed {
			c.mu.Unlock()
			return
		}
		delete(c.pending, tm)
		c.batches.Add(1)
		c.mu.Unlock()
		defer c.batches.Done()
		// Close ends it: a server that does not answer must not hold
		// Close for the release timeout.
		ctx, cancel := context.WithTimeout(c.closeCtx, timeout)
		defer cancel()
		c.untilClose(func() { _ = c.b.Release(ctx, r) })
	})
	c.pending[tm] = struct{}{}
}

// untilClose runs f, a backend call bounded by a context derived from
// closeCtx, and returns when f does or when Close begins, whichever is
// first: a backend call that observes its context's deadline but not its
// cancellation (a driver client that turns the deadline into socket
// timeouts) must not hold Close until that deadline. f then finishes on
// its own goroutine.
func (c *Client) untilClose(f func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	select {
	case <-done:
	case <-c.closing:
	}
}

// limitHold starts the timer of WithMaxHold.
func (l *Lease) limitHold() {
	if l.maxHold <= 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err == nil {
		l.maxTimer = time.AfterFunc(time.Until(l.created.Add(l.maxHold)), l.hitMaxHold)
	}
}

// watchLoss registers l with the backend's loss notification, if any.
func (c *Client) watchLoss(l *Lease) {
	if c.loss == nil {
		return
	}
	stop := c.loss.NotifyLoss(l.req, l.lose)
	l.mu.Lock()
	if l.err == nil {
		l.stopLoss = stop
		stop = nil
	}
	l.mu.Unlock()
	if stop != nil {
		stop()
	}
}

// forget drops an ended lease from the Client's leases and the watchdog.
// A lost reentrant lease stays in its owner's group until it is released,
// so that re-entry reports the loss instead of silently re-acquiring.
func (c *Client) forget(l *Lease) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.leases, l)
	c.renew.remove(l)
	c.expiry.remove(l)
}

// shorten keeps error messages readable for oversized keys.
func shorten(key string) string {
	if len(key) <= 64 {
		return key
	}
	return key[:61] + "..."
}
