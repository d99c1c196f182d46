package dlock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Proclaimer is an optional Backend capability for leader election: the
// backend keeps Request.Value with a KindLock grant (set by TryAcquire and
// Waiter.Wait), reports it in Info.Value, and replaces it with SetValue
// when r.Token's grant r.Fence still holds the lock (else ErrNotHeld).
// Subscribers of the key are notified of a new value as of a release.
type Proclaimer interface {
	SetValue(ctx context.Context, r Request) error
}

// ErrNotLeader reports Proclaim or Resign on an Election that does not
// hold the leadership.
var ErrNotLeader = errors.New("dlock: not the leader")

// ErrNoLeader reports that an election has no leader now.
var ErrNoLeader = errors.New("dlock: no leader")

// Leader describes an election's leader.
type Leader struct {
	Value string        // what the leader proclaimed
	Term  uint64        // the leadership's fence: strictly increasing per election
	Owner string        // the leader's owner token
	TTL   time.Duration // the leadership's remaining lifetime on the server, 0 if unknown
}

// An Election elects one leader among the campaigners on one key. The
// leadership is a Lease of the key's lock: renewed by the watchdog, lost
// with a signal (Done, Context), its fence the leader's term. Anyone can
// read the current leader and observe changes. An Election is one
// campaigner: create one per candidate with Client.Election. Its methods
// are safe for concurrent use.
type Election struct {
	c   *Client
	key string

	mu    sync.Mutex
	lease *Lease // the leadership, while held
}

// Election returns a campaigner for the election on key.
func (c *Client) Election(key string) *Election { return &Election{c: c, key: key} }

// Campaign waits until this campaigner leads, as the wait strategy allows
// (by notification, or in arrival order with WithFIFO), and proclaims
// value. It returns the leadership's Lease; it fails like Client.Acquire,
// and with ErrInvalidOption for WithOwner or a second Campaign while this
// campaigner leads. The backend must implement Proclaimer and Inspector.
func (e *Election) Campaign(ctx context.Context, value string, opts ...Option) (*Lease, error) {
	if err := e.c.checkElection(); err != nil {
		return nil, wrapOp("campaign", e.key, err)
	}
	e.mu.Lock()
	leading := e.lease != nil && e.lease.Err() == nil
	e.mu.Unlock()
	if leading {
		return nil, wrapOp("campaign", e.key, fmt.Errorf("%w: this campaigner already leads", ErrInvalidOption))
	}
	opts = append(opts[:len(opts):len(opts)], func(c *config) error {
		if c.owner != "" {
			return fmt.Errorf("%w: WithOwner: a leadership is not reentrant", ErrInvalidOption)
		}
		c.value = value
		return nil
	})
	l, err := e.c.acquireKind(ctx, e.key, KindLock, 0, opts, false)
	if err != nil {
		return nil, err
	}
	e.mu.Lock()
	e.lease = l
	e.mu.Unlock()
	return l, nil
}

// leadership returns the held leadership, or ErrNotLeader.
func (e *Election) leadership() (*Lease, error) {
	e.mu.Lock()
	l := e.lease
	e.mu.Unlock()
	if l == nil {
		return nil, fmt.Errorf("%w of %q", ErrNotLeader, e.key)
	}
	if err := l.Err(); err != nil {
		return nil, fmt.Errorf("%w of %q: %w", ErrNotLeader, e.key, err)
	}
	return l, nil
}

// Proclaim replaces the leader's value. It returns an error matching
// ErrNotLeader when this campaigner does not lead, and one matching
// ErrNotHeld (the leadership is then lost) when the server no longer
// holds it.
func (e *Election) Proclaim(ctx context.Context, value string) error {
	l, err := e.leadership()
	if err != nil {
		return wrapOp("proclaim", e.key, err)
	}
	r := l.request()
	r.Value = value
	err = e.c.b.(Proclaimer).SetValue(ctx, r)
	if errors.Is(err, ErrNotHeld) {
		l.lose(err)
	}
	if err == nil {
		l.mu.Lock()
		l.req.Value = value // renewals carry the leader's current value
		l.mu.Unlock()
	}
	return wrapOp("proclaim", e.key, err)
}

// Resign gives the leadership up (Release of its Lease). It returns an
// error matching ErrNotLeader when this campaigner does not lead.
func (e *Election) Resign(ctx context.Context) error {
	l, err := e.leadership()
	if err != nil {
		return wrapOp("resign", e.key, err)
	}
	return l.Release(ctx)
}

// Leader returns the current leader, or an error matching ErrNoLeader.
func (e *Election) Leader(ctx context.Context) (Leader, error) {
	if err := e.c.checkElection(); err != nil {
		return Leader{}, wrapOp("leader", e.key, err)
	}
	if ctx == nil {
		return Leader{}, wrapOp("leader", e.key, fmt.Errorf("%w: nil context", ErrInvalidOption))
	}
	info, err := e.c.b.(Inspector).Inspect(ctx, e.key)
	if err != nil {
		return Leader{}, wrapOp("leader", e.key, err)
	}
	if !info.Held || info.Kind != KindLock {
		return Leader{}, wrapOp("leader", e.key, ErrNoLeader)
	}
	return Leader{Value: info.Value, Term: info.Fence, Owner: info.Owner, TTL: info.TTL}, nil
}

// Observe returns a channel that receives the leader each time it
// changes (a new term or a new value), starting with the current one, and
// a zero Leader while the election has none. It is closed when ctx ends,
// when the Client is closed, and at once when the Client or its backend
// cannot run elections (Leader returns the reason). Changes are noticed
// by the backend's notifications (Notifier) and by reading the leader
// every TTL/3 (at most every second); a reader that falls behind sees
// only the latest leader.
func (e *Election) Observe(ctx context.Context) <-chan Leader {
	ch := make(chan Leader, 1)
	if e == nil || e.c.checkElection() != nil || ctx == nil {
		close(ch)
		return ch
	}
	go e.observe(ctx, min(e.c.cfg.ttl/3, time.Second), ch)
	return ch
}

func (e *Election) observe(ctx context.Context, poll time.Duration, ch chan Leader) {
	defer close(ch)
	// Close ends the server calls too: one that hangs must not keep ch open.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(e.c.closeCtx, cancel)()
	var sub <-chan struct{}
	if e.c.notifier != nil {
		s, stop, err := e.c.notifier.Subscribe(ctx, e.key)
		if err == nil {
			defer stop()
			sub = s
		}
	}
	t := time.NewTimer(0)
	defer t.Stop()
	last, first := Leader{}, true
	for {
		select {
		case <-ctx.Done():
			return
		case <-e.c.closing:
			return
		case <-sub:
		case <-t.C:
		}
		cur, err := e.Leader(ctx)
		if err != nil && !errors.Is(err, ErrNoLeader) {
			if ctx.Err() != nil || errors.Is(err, ErrClosed) || errors.Is(err, ErrInvalidOption) || errors.Is(err, errors.ErrUnsupported) {
				return // ended, or it never will answer
			}
			t.Reset(poll)
			continue
		}
		cur.TTL = 0
		if first || cur != last {
			first, last = false, cur
			select {
			case <-ch: // drop the stale one
			default:
			}
			ch <- cur
		}
		t.Reset(poll)
	}
}

// checkElection reports whether the backend can run elections.
func (c *Client) checkElection() error {
	if err := c.usable(); err != nil {
		return err
	}
	_, p := c.b.(Proclaimer)
	_, i := c.b.(Inspector)
	if !p || !i {
		return fmt.Errorf("dlock: backend %T has no leader election: %w", c.b, errors.ErrUnsupported)
	}
	return nil
}
