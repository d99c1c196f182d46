package redislock

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// The hub multiplexes the release notifications of every key a Backend's
// waiters wait on over ONE pub/sub connection, read by ONE dispatch
// goroutine (both started by the first Watch or Wait, ended by Close).
//
// Each channel ("topic") is subscribed on the server while it has waiters:
// SUBSCRIBE for the first, UNSUBSCRIBE after the last. Watch returns
// only once the server has confirmed the subscription. Replies on one
// connection come in command order, so a "subscribe" confirmation counts
// only when no UNSUBSCRIBE of the same channel is still unconfirmed (it
// would otherwise confirm a subscription that is about to be undone).
//
// When the connection breaks, go-redis reconnects and resubscribes every
// channel; releases published meanwhile are lost, so the waiters of each
// channel are woken when its subscription is confirmed again. The
// dispatcher also checks the connection's health: after the subscribe
// timeout without traffic it sends a PING, and after another one without a
// reply it replaces the connection (a half-open TCP connection would
// otherwise go unnoticed for minutes).
//
// wsem (a mutex that a waiting caller can give up on) orders the
// SUBSCRIBE/UNSUBSCRIBE writes like the state changes that cause them; mu
// guards the state and is never held during I/O.
//
// FIFO waiters (Wait) are woken on the Backend's own wake channel, which
// releases PUBLISH on when they hand the lock to one of this Backend's
// waiters. It is subscribed by the first Wait and stays subscribed until
// Close (a permanent waiter holds it), so a wait costs no SUBSCRIBE. Its
// messages are routed by payload (after the hand-off's fence, deadline and
// claim TTL: "#lock:lock" + token) to the one waiter they are for; when the
// channel is subscribed again after a reconnect, every routed waiter is
// woken to check its state.
type hub struct {
	b *Backend

	wsem    chan struct{} // buffer one; made by New
	wakeSem chan struct{} // buffer one; made by New: serializes wakeReady

	mu      sync.Mutex
	ps      *redis.PubSub // nil until the first Watch or Wait
	topics  map[string]*topic
	closed  bool
	broken  bool // the connection must be replaced (a resubscription failed)
	stop    chan struct{}
	done    chan struct{}
	started bool

	wakeLive bool                            // the wake channel is subscribed for good
	routes   map[string]map[*waiter]struct{} // FIFO waiters by route
}

type topic struct {
	waiters map[*waiter]struct{}
	want    bool // the last command sent for the channel was SUBSCRIBE
	live    bool // confirmed on the current connection, no UNSUBSCRIBE since
	unsubs  int  // UNSUBSCRIBE commands written but not yet confirmed
	resync  bool // the connection changed: wake the waiters on confirmation
}

type waiter struct {
	ch        chan struct{} // release notifications, buffer one
	ready     chan struct{} // closed when confirmed or failed
	err       error         // set before ready is closed, on failure
	confirmed bool          // ready is closed; guarded by hub.mu
	handoff   handoff       // the last hand-off message (FIFO); guarded by hub.mu
}

// handoff is what a hand-off message tells the FIFO waiter it is for
// (queue_lib.lua, tell): the lock's new fence, the waiter's heartbeat
// deadline the release read (it names the waiter's step that the hand-off
// followed) and the claim TTL the lock is reserved for. ok is false for
// none.
type handoff struct {
	fence    uint64
	deadline int64
	claim    time.Duration
	ok       bool
}

// parseWake splits a wake message payload "FENCE DEADLINE CLAIM ROUTE" into
// the hand-off and the route. A payload of another form is all route.
func parseWake(payload string) (handoff, string) {
	var f [3]string
	rest := payload
	for i := range f {
		var ok bool
		if f[i], rest, ok = strings.Cut(rest, " "); !ok {
			return handoff{}, payload
		}
	}
	fence, err1 := strconv.ParseUint(f[0], 10, 64)
	deadline, err2 := strconv.ParseInt(f[1], 10, 64)
	claim, err3 := strconv.ParseInt(f[2], 10, 64)
	if err1 != nil || err2 != nil || err3 != nil || fence == 0 || claim <= 0 {
		return handoff{}, payload
	}
	return handoff{fence: fence, deadline: deadline, claim: time.Duration(claim) * time.Millisecond, ok: true}, rest
}

func (w *waiter) confirm(err error) {
	if w.confirmed {
		return
	}
	w.confirmed = true
	w.err = err
	close(w.ready)
}

func (w *waiter) notify() {
	select {
	case w.ch <- struct{}{}:
	default:
	}
}

// Watch returns a channel that receives a value (without blocking,
// buffer one) after each release of key that a TryAcquire found held, and
// a function that ends the watch. It returns once the server confirmed the
// subscription on the Backend's shared pub/sub connection, or fails after
// ctx ends or WithSubscribeTimeout passes. Messages are hints: one lost
// while the connection was re-established is made up for by a wake-up
// when it is back. Package redlock uses it; the dlock.Client waits in the
// queue (Wait) instead.
func (b *Backend) Watch(ctx context.Context, key string) (<-chan struct{}, func(), error) {
	if err := b.checkKey(ctx, key); err != nil {
		return nil, nil, err
	}
	name := channelName(b.lockName(key))
	w := &waiter{ch: make(chan struct{}, 1), ready: make(chan struct{})}
	h := &b.hub
	if err := h.add(ctx, name, w); err != nil {
		if errors.Is(err, errClosed) {
			return nil, nil, errClosed
		}
		return nil, nil, b.callErr("subscribe", key, err)
	}
	stop := sync.OnceFunc(func() { h.remove(name, w) })
	timer := time.NewTimer(b.cfg.subTimeout)
	defer timer.Stop()
	select {
	case <-w.ready:
		if errors.Is(w.err, errClosed) {
			stop()
			return nil, nil, errClosed
		}
		if w.err != nil {
			stop()
			return nil, nil, b.callErr("subscribe", key, w.err)
		}
		return w.ch, stop, nil
	case <-ctx.Done():
		stop()
		return nil, nil, b.callErr("subscribe", key, ctx.Err())
	case <-timer.C:
		stop()
		h.mu.Lock()
		h.broken = true // self-repair: replace the connection
		h.mu.Unlock()
		return nil, nil, b.callErr("subscribe", key, fmt.Errorf("no confirmation from the server within %v", b.cfg.subTimeout))
	}
}

// lockW takes wsem, giving up when ctx ends.
func (h *hub) lockW(ctx context.Context) error {
	select {
	case h.wsem <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (h *hub) unlockW() { <-h.wsem }

// pause doubles backoff (10 ms to 1 s) and waits that long on timer; it
// returns false when the hub is stopped meanwhile.
func (h *hub) pause(backoff *time.Duration, timer *time.Timer) bool {
	*backoff = min(max(2**backoff, 10*time.Millisecond), time.Second)
	timer.Reset(*backoff)
	select {
	case <-h.stop:
		return false
	case <-timer.C:
		return true
	}
}

// writeCtx bounds a pub/sub write by the subscribe timeout and ctx's
// deadline, but not by ctx's cancellation: go-redis drops the connection
// (and every subscription on it) when a write is cancelled.
func (h *hub) writeCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	deadline := time.Now().Add(h.b.cfg.subTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	return context.WithDeadline(context.WithoutCancel(ctx), deadline)
}

// add registers w on the channel name, subscribing it on the server if w
// is its first waiter.
func (h *hub) add(ctx context.Context, name string, w *waiter) error {
	if err := h.lockW(ctx); err != nil {
		return err
	}
	defer h.unlockW()
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return errClosed
	}
	if h.ps == nil {
		h.ps = h.b.rdb.Subscribe(context.Background())
		h.topics = make(map[string]*topic)
		h.stop = make(chan struct{})
		h.done = make(chan struct{})
		h.started = true
		go h.run()
	}
	t := h.topics[name]
	if t == nil {
		t = &topic{waiters: make(map[*waiter]struct{})}
		h.topics[name] = t
	}
	t.waiters[w] = struct{}{}
	send := !t.want
	if send {
		t.want, t.live = true, false
	} else if t.live {
		w.confirm(nil)
	}
	ps := h.ps
	h.mu.Unlock()
	if !send {
		return nil
	}

	wctx, cancel := h.writeCtx(ctx)
	defer cancel()
	err := ps.Subscribe(wctx, name)
	if err == nil {
		return nil
	}
	// The SUBSCRIBE may not have reached the server (and go-redis keeps the
	// channel on its list even so): fail the waiters that were waiting for
	// it and take the channel off the list.
	h.mu.Lock()
	if h.closed {
		err = errClosed
	}
	t.want = false
	for x := range t.waiters {
		x.confirm(err)
	}
	t.unsubs++
	h.mu.Unlock()
	h.unsubscribe(ps, name, t)
	return nil
}

// remove ends w's subscription, unsubscribing the channel on the server
// after its last waiter.
func (h *hub) remove(name string, w *waiter) {
	_ = h.lockW(context.Background())
	defer h.unlockW()
	h.mu.Lock()
	t := h.topics[name]
	if t == nil {
		h.mu.Unlock()
		return
	}
	delete(t.waiters, w)
	if len(t.waiters) > 0 || h.closed {
		h.mu.Unlock()
		return
	}
	if !t.want {
		h.dropIfIdle(name, t)
		h.mu.Unlock()
		return
	}
	t.want, t.live = false, false
	t.unsubs++
	ps := h.ps
	h.mu.Unlock()
	h.unsubscribe(ps, name, t)
}

// unsubscribe writes UNSUBSCRIBE name; t.unsubs was counted before. On a
// failed write go-redis drops the connection, so no confirmation will
// come: the count is taken back. wsem must be held.
func (h *hub) unsubscribe(ps *redis.PubSub, name string, t *topic) {
	ctx, cancel := context.WithTimeout(context.Background(), h.b.cfg.subTimeout)
	defer cancel()
	if err := ps.Unsubscribe(ctx, name); err != nil {
		h.mu.Lock()
		if t.unsubs > 0 {
			t.unsubs--
		}
		h.dropIfIdle(name, t)
		h.mu.Unlock()
	}
}

// dropIfIdle forgets a topic nobody waits on and the server no longer
// subscribes. h.mu must be held.
func (h *hub) dropIfIdle(name string, t *topic) {
	if len(t.waiters) == 0 && !t.want && t.unsubs == 0 && h.topics[name] == t {
		delete(h.topics, name)
	}
}

// run is the dispatch goroutine: it reads the pub/sub connection and fans
// notifications out to the waiters of each channel.
func (h *hub) run() {
	defer close(h.done)
	var (
		backoff time.Duration
		pinged  bool
		timer   = time.NewTimer(time.Hour)
	)
	timer.Stop()
	defer timer.Stop()
	for {
		h.mu.Lock()
		ps, closed, broken := h.ps, h.closed, h.broken
		h.mu.Unlock()
		if closed {
			return
		}
		if broken {
			pinged = false
			if err := h.replace(); err == nil {
				continue
			}
			// Try again on a fresh connection after a pause.
			if !h.pause(&backoff, timer) {
				return
			}
			continue
		}
		msg, err := ps.ReceiveTimeout(context.Background(), h.b.cfg.subTimeout)
		if err != nil {
			if h.isClosed() {
				return
			}
			if isTimeout(err) {
				if pinged {
					// No reply to the PING: the connection is dead or the
					// server is not answering. Start over on a new one.
					h.mu.Lock()
					h.broken = true
					h.mu.Unlock()
					continue
				}
				ctx, cancel := context.WithTimeout(context.Background(), h.b.cfg.subTimeout)
				err = ps.Ping(ctx)
				cancel()
				if err == nil {
					pinged = true
					continue
				}
			}
			// The connection failed: go-redis has dropped it and dials a new
			// one, resubscribing every channel, on the next call.
			pinged = false
			h.connLost()
			if !h.pause(&backoff, timer) {
				return
			}
			continue
		}
		backoff, pinged = 0, false
		switch m := msg.(type) {
		case *redis.Message:
			h.notify(m.Channel, m.Payload)
		case *redis.Subscription:
			h.confirmed(m)
		}
	}
}

func (h *hub) isClosed() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.closed
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// notify wakes every waiter of the channel, or, on the wake channel, the
// FIFO waiters of the payload's route.
func (h *hub) notify(name, payload string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if name == h.b.wake {
		ho, route := parseWake(payload)
		for w := range h.routes[route] {
			w.handoff = ho
			w.notify()
		}
		return
	}
	if t := h.topics[name]; t != nil {
		for w := range t.waiters {
			w.notify()
		}
	}
}

// notifyRoutes wakes every FIFO waiter. h.mu must be held.
func (h *hub) notifyRoutes() {
	for _, ws := range h.routes {
		for w := range ws {
			w.notify()
		}
	}
}

// wakeReady subscribes the wake channel once, for the Backend's lifetime,
// and returns when the server has confirmed it (or fails after ctx ends or
// the subscribe timeout; a later call tries again).
func (h *hub) wakeReady(ctx context.Context) error {
	h.mu.Lock()
	live := h.wakeLive
	h.mu.Unlock()
	if live {
		return nil
	}
	select {
	case h.wakeSem <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-h.wakeSem }()
	h.mu.Lock()
	live = h.wakeLive
	h.mu.Unlock()
	if live {
		return nil
	}
	name := h.b.wake
	w := &waiter{ch: make(chan struct{}, 1), ready: make(chan struct{})}
	if err := h.add(ctx, name, w); err != nil {
		return err
	}
	timer := time.NewTimer(h.b.cfg.subTimeout)
	defer timer.Stop()
	select {
	case <-w.ready:
		if w.err != nil {
			h.remove(name, w)
			return w.err
		}
		h.mu.Lock()
		h.wakeLive = true
		h.mu.Unlock()
		return nil
	case <-ctx.Done():
		h.remove(name, w)
		return ctx.Err()
	case <-timer.C:
		h.remove(name, w)
		h.mu.Lock()
		h.broken = true // self-repair: replace the connection
		h.mu.Unlock()
		return fmt.Errorf("no confirmation from the server within %v", h.b.cfg.subTimeout)
	}
}

// route registers a FIFO waiter for the wake messages with payload route.
// After Close it returns a waiter that is already notified.
func (h *hub) route(route string) *waiter {
	w := &waiter{ch: make(chan struct{}, 1)}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		w.notify()
		return w
	}
	if h.routes == nil {
		h.routes = make(map[string]map[*waiter]struct{})
	}
	ws := h.routes[route]
	if ws == nil {
		ws = make(map[*waiter]struct{})
		h.routes[route] = ws
	}
	ws[w] = struct{}{}
	return w
}

// takeHandoff returns and forgets the last hand-off message for w.
func (h *hub) takeHandoff(w *waiter) handoff {
	h.mu.Lock()
	defer h.mu.Unlock()
	ho := w.handoff
	w.handoff = handoff{}
	return ho
}

// unroute removes a FIFO waiter registered by route.
func (h *hub) unroute(route string, w *waiter) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if ws := h.routes[route]; ws != nil {
		delete(ws, w)
		if len(ws) == 0 {
			delete(h.routes, route)
		}
	}
}

// confirmed handles the server's reply to SUBSCRIBE or UNSUBSCRIBE.
func (h *hub) confirmed(m *redis.Subscription) {
	h.mu.Lock()
	defer h.mu.Unlock()
	t := h.topics[m.Channel]
	if t == nil {
		return
	}
	switch m.Kind {
	case "subscribe":
		if t.unsubs > 0 || !t.want {
			return // precedes an UNSUBSCRIBE still in flight
		}
		if !t.live {
			t.live = true
			for w := range t.waiters {
				w.confirm(nil)
			}
		}
		if t.resync {
			t.resync = false
			for w := range t.waiters {
				w.notify()
			}
			if m.Channel == h.b.wake {
				h.notifyRoutes()
			}
		}
	case "unsubscribe":
		if t.unsubs > 0 {
			t.unsubs--
		}
		h.dropIfIdle(m.Channel, t)
	}
}

// connLost records that the connection was dropped: its unconfirmed
// UNSUBSCRIBEs will never be answered, and the waiters must be woken once
// the channel is subscribed again.
func (h *hub) connLost() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for name, t := range h.topics {
		t.unsubs, t.live, t.resync = 0, false, true
		h.dropIfIdle(name, t)
	}
}

// replace swaps the pub/sub connection for a new one and subscribes every
// wanted channel on it. On failure it marks the hub broken again.
func (h *hub) replace() error {
	_ = h.lockW(context.Background())
	defer h.unlockW()
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return nil
	}
	h.broken = false
	old := h.ps
	h.ps = h.b.rdb.Subscribe(context.Background())
	ps := h.ps
	var names []string
	for name, t := range h.topics {
		t.unsubs, t.live, t.resync = 0, false, true
		if t.want {
			names = append(names, name)
		} else {
			h.dropIfIdle(name, t)
		}
	}
	h.mu.Unlock()
	_ = old.Close()
	if len(names) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), h.b.cfg.subTimeout)
	defer cancel()
	err := ps.Subscribe(ctx, names...)
	if err != nil {
		// A failed dial leaves the channels to be subscribed by the next
		// dial, but a failed write may not: start over.
		h.mu.Lock()
		h.broken = true
		h.mu.Unlock()
	}
	return err
}

// close ends the connection and the dispatcher; waiters still waiting for
// a confirmation fail with ErrClosed.
func (h *hub) close() error {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return nil
	}
	h.closed = true
	ps, started := h.ps, h.started
	for _, t := range h.topics {
		for w := range t.waiters {
			w.confirm(errClosed)
		}
	}
	h.notifyRoutes() // FIFO waiters see the Backend closed
	h.mu.Unlock()
	if !started {
		return nil
	}
	err := ps.Close()
	close(h.stop)
	<-h.done
	if errors.Is(err, redis.ErrClosed) {
		err = nil
	}
	if err != nil {
		return fmt.Errorf("redislock: close the subscription: %w", err)
	}
	return nil
}
