package pglock

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// listener is a Backend's one LISTEN session. Every waiter of the Backend
// has a row in the waiters table naming the listener's channel and a tag;
// a release notifies the channel of the oldest live waiter of its key with
// "TAG:KEY", and the listener wakes that waiter alone. The listener renews
// its waiters' rows on its own connection (so rows of a listener whose
// session broke stop being chosen within the waiter TTL) and reconnects
// after a broken session, waking every local waiter once so that none
// waits on a notification lost meanwhile.
type listener struct {
	b       *Backend
	cfg     *pgx.ConnConfig
	channel string

	mu         sync.Mutex // never held during I/O
	started    bool
	connecting chan struct{} // closed when the running first dial ends
	live       bool
	next       int64
	subs       map[int64]chan struct{}
	tagKeys    map[int64]string // the key of each waiter
	keys       map[string]int   // waiters per key
}

func newListener(b *Backend, cfg *pgx.ConnConfig) *listener {
	var id [8]byte
	_, _ = rand.Read(id[:])
	return &listener{b: b, cfg: cfg, channel: "dlock_" + hex.EncodeToString(id[:]),
		subs: make(map[int64]chan struct{}), tagKeys: make(map[int64]string), keys: make(map[string]int)}
}

// waiting reports whether a waiter of this listener is subscribed to key
// (false for a nil listener: WithoutListen).
func (l *listener) waiting(key string) bool {
	if l == nil {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.keys[key] > 0
}

// Subscribe registers a waiter for key: the next release of key that
// picks this waiter (the oldest live one) sends on the channel. It returns
// once the LISTEN session is active and the waiter's row is committed.
// With WithoutListen it returns an error matching errors.ErrUnsupported.
func (b *Backend) Subscribe(ctx context.Context, key string) (<-chan struct{}, func(), error) {
	if err := b.enterKey(ctx, key); err != nil {
		return nil, nil, err
	}
	l := b.lis
	if l == nil {
		return nil, nil, fmt.Errorf("pglock: subscribe: notifications are off (WithoutListen): %w", errors.ErrUnsupported)
	}
	if err := l.ensure(ctx); err != nil {
		return nil, nil, err
	}
	ch := make(chan struct{}, 1)
	l.mu.Lock()
	if !l.live {
		l.mu.Unlock()
		return nil, nil, errors.New("pglock: subscribe: the listen session is down, reconnecting")
	}
	l.next++
	tag := l.next
	l.subs[tag] = ch
	l.tagKeys[tag] = key
	l.keys[key]++
	l.mu.Unlock()
	err := b.retry(ctx, func() error { // the row is unique per channel and tag: inserting twice is once
		_, err := b.pool.Exec(ctx, b.stmts.addWaiter, key, l.channel, tag, b.cfg.waiterTTL.Microseconds())
		return err
	})
	if err != nil {
		l.remove(tag)
		return nil, nil, wrap("subscribe", err)
	}
	var once sync.Once
	stop := func() {
		once.Do(func() {
			l.remove(tag)
			// The Client stops a subscription before Acquire returns: the
			// row is deleted before stop returns (a stale row of the new
			// holder would take its next release's wake-up, which the
			// listener then passes on: one more round trip per hand-off),
			// unless the server takes longer than leaveWait, when the
			// delete goes on in the background. A row left behind (the
			// delete failed, or Close came first) is no longer renewed and
			// stops being chosen after the waiter TTL; a wake-up sent to it
			// meanwhile is passed on.
			done := make(chan struct{})
			b.bgMu.Lock()
			if b.closed.Load() {
				b.bgMu.Unlock()
				return
			}
			b.goBackground(func(ctx context.Context) {
				defer close(done)
				ctx, cancel := context.WithTimeout(ctx, b.cfg.waiterTTL)
				defer cancel()
				_, _ = b.pool.Exec(ctx, b.stmts.delWaiter, l.channel, tag)
			})
			b.bgMu.Unlock()
			t := time.NewTimer(leaveWait)
			defer t.Stop()
			select {
			case <-done:
			case <-t.C:
			}
		})
	}
	return ch, stop, nil
}

// leaveWait bounds how long stopping a subscription waits for its row to
// be deleted.
const leaveWait = MinTTL

func (l *listener) remove(tag int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if key, ok := l.tagKeys[tag]; ok {
		delete(l.subs, tag)
		delete(l.tagKeys, tag)
		if l.keys[key]--; l.keys[key] <= 0 {
			delete(l.keys, key)
		}
	}
}

// ensure opens the session and starts the listen loop, once. One caller
// dials, without holding l.mu; the others wait for it within their own
// contexts, and one of them dials again if it failed.
func (l *listener) ensure(ctx context.Context) error {
	for {
		l.mu.Lock()
		if l.started {
			l.mu.Unlock()
			return nil
		}
		if c := l.connecting; c != nil {
			l.mu.Unlock()
			select {
			case <-c:
				continue
			case <-ctx.Done():
				return wrap("listen", ctx.Err())
			}
		}
		c := make(chan struct{})
		l.connecting = c
		l.mu.Unlock()
		err := l.start(ctx)
		l.mu.Lock()
		l.connecting = nil
		close(c)
		l.mu.Unlock()
		return err
	}
}

// start dials the session and starts the listen loop.
func (l *listener) start(ctx context.Context) error {
	conn, err := l.connect(ctx)
	if err != nil {
		return wrap("listen", err)
	}
	b := l.b
	b.bgMu.Lock()
	defer b.bgMu.Unlock()
	if b.closed.Load() {
		closeConn(conn)
		return errClosed
	}
	l.mu.Lock()
	l.started, l.live = true, true
	l.mu.Unlock()
	b.goBackground(func(ctx context.Context) { l.run(ctx, conn) })
	return nil
}

func (l *listener) connect(ctx context.Context) (*pgx.Conn, error) {
	conn, err := pgx.ConnectConfig(ctx, l.cfg)
	if err != nil {
		return nil, err
	}
	if _, err := conn.Exec(ctx, "LISTEN "+l.channel); err != nil {
		closeConn(conn)
		return nil, err
	}
	return conn, nil
}

func closeConn(conn *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = conn.Close(ctx)
}

// run waits for notifications, renews the waiters' rows every waiter
// TTL/3 and reconnects a broken session until ctx ends.
func (l *listener) run(ctx context.Context, conn *pgx.Conn) {
	period := l.b.cfg.waiterTTL / 3
	beat := time.Now()
	for {
		if time.Since(beat) >= period {
			if err := l.heartbeat(ctx, conn); err != nil && ctx.Err() == nil {
				conn = l.reconnect(ctx, conn)
			}
			beat = time.Now()
		}
		if ctx.Err() != nil {
			closeConn(conn)
			return
		}
		wctx, cancel := context.WithTimeout(ctx, time.Until(beat.Add(period)))
		n, err := conn.WaitForNotification(wctx)
		cancel()
		switch {
		case ctx.Err() != nil:
			closeConn(conn)
			return
		case err == nil:
			l.dispatch(ctx, conn, n.Payload)
		case wctx.Err() != nil && !conn.IsClosed():
			// The heartbeat is due.
		default:
			conn = l.reconnect(ctx, conn)
			beat = time.Time{}
		}
	}
}

// heartbeat renews the rows of the waiters registered now.
func (l *listener) heartbeat(ctx context.Context, conn *pgx.Conn) error {
	l.mu.Lock()
	tags := make([]int64, 0, len(l.subs))
	for t := range l.subs {
		tags = append(tags, t)
	}
	l.mu.Unlock()
	if len(tags) == 0 {
		return nil
	}
	hctx, cancel := context.WithTimeout(ctx, l.b.cfg.waiterTTL/3)
	defer cancel()
	_, err := conn.Exec(hctx, l.b.stmts.heartbeat, l.channel, tags, l.b.cfg.waiterTTL.Microseconds())
	return err
}

// dispatch wakes the waiter a notification names; a waiter that already
// left passes the wake-up on.
func (l *listener) dispatch(ctx context.Context, conn *pgx.Conn, payload string) {
	t, key, ok := strings.Cut(payload, ":")
	tag, err := strconv.ParseInt(t, 10, 64)
	if !ok || err != nil {
		return
	}
	l.mu.Lock()
	ch, found := l.subs[tag]
	l.mu.Unlock()
	if found {
		select {
		case ch <- struct{}{}:
		default:
		}
		return
	}
	fctx, cancel := context.WithTimeout(ctx, l.b.cfg.waiterTTL/3)
	defer cancel()
	_, _ = conn.Exec(fctx, l.b.stmts.forward, key, l.channel, tag)
}

// reconnect replaces a broken session, retrying with a growing pause (at
// most a second) until it succeeds or ctx ends. Meanwhile Subscribe fails
// and waiters fall back to the holder's TTL; once back, every local waiter
// is woken once.
func (l *listener) reconnect(ctx context.Context, old *pgx.Conn) *pgx.Conn {
	l.mu.Lock()
	l.live = false
	l.mu.Unlock()
	closeConn(old)
	pause := 10 * time.Millisecond
	for {
		cctx, cancel := context.WithTimeout(ctx, max(l.b.cfg.waiterTTL, 2*time.Second))
		conn, err := l.connect(cctx)
		cancel()
		if err == nil {
			l.mu.Lock()
			l.live = true
			for _, ch := range l.subs {
				select {
				case ch <- struct{}{}:
				default:
				}
			}
			l.mu.Unlock()
			return conn
		}
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return old // closed; run returns on ctx
		case <-t.C:
		}
		pause = min(2*pause, time.Second)
	}
}
