package redlock

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/redislock"
)

var (
	_ dlock.Backend        = (*Backend)(nil)
	_ dlock.BatchRefresher = (*Backend)(nil)
	_ dlock.Notifier       = (*Backend)(nil)
	_ dlock.Inspector      = (*Backend)(nil)
	_ dlock.ForceReleaser  = (*Backend)(nil)
)

// Backend is a dlock.Backend over N independent Redis servers (nodes): a
// lock is held when a majority of the nodes hold it. It implements
// dlock.Backend, dlock.BatchRefresher, dlock.Notifier, dlock.Inspector and
// dlock.ForceReleaser; it has no server-side queue, so the Client refuses
// WithFIFO. Each node is driven by its own redislock.Backend (same scripts,
// fences and key layout as a single-node lock). Create it with New or
// NewWithOptions; it is safe for concurrent use.
type Backend struct {
	nodes  []*redislock.Backend
	rdbs   []redislock.Client
	cte    []bool   // the node's client has ContextTimeoutEnabled
	names  []string // node addresses, for NodeError
	all    []int    // 0..N-1
	quorum int
	cfg    config
	err    error  // from NewWithOptions: returned by every call
	id     string // random, in the node tokens of this Backend's reentrant attempts

	// floor is the last fence floor proposed (see propose); ahead how far
	// (µs) the nodes' clocks were seen ahead of this process's (see learn).
	floor atomic.Uint64
	ahead atomic.Int64

	workers workers // run the node calls of fan-outs

	mu     sync.Mutex
	closed bool
	bg     sync.WaitGroup // background clean-ups, awaited by Close
}

// New returns a Backend over the given nodes with the default options. It
// is NewWithOptions(nodes) and exists so that a slice of clients spreads:
//
//	b := redlock.New(rdbs...) // rdbs []*redis.Client
//
// Clients of different types need an explicit type argument:
// redlock.New[redislock.Client](a, b, c).
func New[C redislock.Client](nodes ...C) *Backend {
	return NewWithOptions(nodes)
}

// NewWithOptions returns a Backend that takes locks on a majority of
// nodes, configured by opts. Each node must be an independent Redis server
// (not a replica of another, not a shard of one cluster), reached through
// any go-redis v9 client that redislock accepts, usually *redis.Client.
// The number of nodes must be odd and at least MinNodes (3); the quorum is
// N/2+1. NewWithOptions does not contact the servers and never closes the
// clients.
//
// If a node is nil or appears twice, the count is even or below 3, or an
// option is invalid, the Backend is still returned but every call on it
// fails with that error (matching dlock.ErrInvalidOption), which Err also
// returns.
func NewWithOptions[C redislock.Client](nodes []C, opts ...Option) *Backend {
	b := &Backend{cfg: defaultConfig(), id: rand.Text()[:10]}
	for _, o := range opts {
		if o == nil {
			b.err = fmt.Errorf("redlock: %w: nil Option", dlock.ErrInvalidOption)
			return b
		}
		if err := o(&b.cfg); err != nil {
			b.err = err
			return b
		}
	}
	n := len(nodes)
	if n < MinNodes || n%2 == 0 {
		b.err = fmt.Errorf("redlock: %w: %d nodes; Redlock needs an odd number of independent nodes, at least %d", dlock.ErrInvalidOption, n, MinNodes)
		return b
	}
	names := make(map[string]bool, n)
	ptrs := make(map[uintptr]bool, n)
	for i, c := range nodes {
		v := reflect.ValueOf(c)
		if !v.IsValid() || (v.Kind() == reflect.Pointer && v.IsNil()) {
			b.err = fmt.Errorf("redlock: %w: node %d is nil", dlock.ErrInvalidOption, i)
			return b
		}
		name, cte := describeNode(c)
		if name == "" {
			name = "node" + strconv.Itoa(i)
		}
		if v.Kind() == reflect.Pointer {
			if ptrs[v.Pointer()] {
				b.err = fmt.Errorf("redlock: %w: node %d (%s) is given twice", dlock.ErrInvalidOption, i, name)
				return b
			}
			ptrs[v.Pointer()] = true
		}
		if names[name] {
			b.err = fmt.Errorf("redlock: %w: two nodes have the address %s; Redlock needs independent servers", dlock.ErrInvalidOption, name)
			return b
		}
		names[name] = true
		b.names = append(b.names, name)
		b.rdbs = append(b.rdbs, c)
		b.cte = append(b.cte, cte)
		b.all = append(b.all, i)
	}
	for i, c := range b.rdbs {
		nb := redislock.New(c, b.cfg.node...)
		if err := nb.Err(); err != nil && b.err == nil {
			b.err = fmt.Errorf("redlock: node %s: %w", b.names[i], err)
		}
		b.nodes = append(b.nodes, nb)
	}
	b.quorum = n/2 + 1
	return b
}

// describeNode returns the address of the server behind c, "" when c
// does not tell (a Sentinel-managed client reports "FailoverClient"), and
// whether c bounds socket I/O by a context's deadline (go-redis
// ContextTimeoutEnabled).
func describeNode(c redislock.Client) (string, bool) {
	switch c := c.(type) {
	case interface{ Options() *redis.Options }:
		o := c.Options()
		if o.Addr == "FailoverClient" {
			return "", o.ContextTimeoutEnabled
		}
		return o.Addr, o.ContextTimeoutEnabled
	case interface{ Options() *redis.ClusterOptions }:
		o := c.Options()
		return strings.Join(o.Addrs, ","), o.ContextTimeoutEnabled
	}
	return "", false
}

// Err returns the configuration error recorded by NewWithOptions, or nil.
func (b *Backend) Err() error { return b.err }

// Nodes returns the nodes' addresses (or "nodeI" when a client does not
// tell), in the order given to New: the Node of every dlock.NodeError.
func (b *Backend) Nodes() []string { return slices.Clone(b.names) }

// Quorum returns the number of nodes that must agree: N/2+1.
func (b *Backend) Quorum() int { return b.quorum }

var errClosed = fmt.Errorf("redlock: %w", dlock.ErrClosed)

func (b *Backend) isClosed() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.closed
}

// checkKey validates what every call needs.
func (b *Backend) checkKey(ctx context.Context, key string) error {
	if b.err != nil {
		return b.err
	}
	if ctx == nil {
		return fmt.Errorf("redlock: %w: nil context", dlock.ErrInvalidOption)
	}
	if b.isClosed() {
		return errClosed
	}
	return dlock.ValidateKey(key)
}

// check validates a request.
func (b *Backend) check(ctx context.Context, r *dlock.Request, needTTL bool) error {
	if err := b.checkKey(ctx, r.Key); err != nil {
		return err
	}
	if r.Token == "" {
		return fmt.Errorf("redlock: %w: empty owner token", dlock.ErrInvalidOption)
	}
	if needTTL && r.TTL < MinTTL {
		return fmt.Errorf("redlock: %w: %v is below the Redlock minimum %v", dlock.ErrInvalidTTL, r.TTL, MinTTL)
	}
	return nil
}

// nodeToken returns the owner token a non-reentrant lease of token with
// fence uses on the nodes: token "~" fence in base 36. An acquisition
// attempt takes the nodes under nodeToken(token, floor), its proposed fence
// floor (see propose), which no other attempt of any lease shares (a
// reentrant attempt: nodeToken(token "~" the Backend's id, floor)), so a
// straggling command of an earlier attempt can never touch a later grant.
// Refresh and Release derive it from the request's token and fence; a
// reentrant request uses its token as it is.
func nodeToken(token string, fence uint64) string {
	return token + "~" + strconv.FormatUint(fence, 36)
}

// nodeRequest returns r as the nodes know it: with the lease's node token
// when r is not reentrant and has a fence.
func nodeRequest(r dlock.Request) dlock.Request {
	if !r.Reentrant && r.Fence != 0 {
		r.Token = nodeToken(r.Token, r.Fence)
	}
	return r
}

// proposeMargin is how far ahead of this process's clock (and of what the
// nodes were seen to issue) propose places a floor: more than a node's
// script usually runs after the proposal, so that every node issues the
// floor itself and no write-back is needed.
const proposeMargin = 5 * time.Millisecond

// propose returns the fence floor of an attempt: this
// process's clock in µs, plus how far ahead the nodes' clocks were seen,
// plus proposeMargin, and above every floor proposed or fence seen before.
// The nodes issue max(server time in µs, floor, a tombstone's fence + 1):
// when every node issues exactly the floor, they agree without a
// write-back.
func (b *Backend) propose() uint64 {
	for {
		last := b.floor.Load()
		p := uint64(time.Now().UnixMicro() + b.ahead.Load() + proposeMargin.Microseconds())
		if p <= last {
			p = last + 1
		}
		if b.floor.CompareAndSwap(last, p) {
			return p
		}
	}
}

// learn records what an attempt saw: the next floor is above the fences
// granted, and ahead becomes how far the nodes' clocks run ahead of this
// process's (skews, where seen), at least 0. It follows the clocks, not the
// fences: a fence raised by an earlier grant's tombstone says nothing
// about clocks, and floors that ran ahead by more than the clocks do
// would outrun the lease TTL (see doc.go, Fencing).
func (b *Backend) learn(acq []answer[dlock.Grant], skews []atomic.Int64, seen []atomic.Bool) {
	ahead, known := int64(0), false
	for i, a := range acq {
		if !a.done || a.err != nil || !a.val.OK {
			continue
		}
		raise(&b.floor, a.val.Fence)
		if seen[i].Load() {
			ahead, known = max(ahead, skews[i].Load()), true
		}
	}
	if known {
		b.ahead.Store(ahead)
	}
}

// raise sets v to max(v, x).
func raise[T uint64 | int64, A interface {
	Load() T
	CompareAndSwap(old, new T) bool
}](v A, x T) {
	for cur := v.Load(); x > cur; cur = v.Load() {
		if v.CompareAndSwap(cur, x) {
			return
		}
	}
}

// background runs fn on a goroutine that Close waits for. It returns false,
// and does not run fn, once the Backend is closed.
func (b *Backend) background(fn func()) bool {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return false
	}
	b.bg.Add(1)
	b.mu.Unlock()
	go func() {
		defer b.bg.Done()
		fn()
	}()
	return true
}

// Refresh implements dlock.Backend: every node extends the lock to r.TTL
// if r.Token (and r.Fence, when set) holds it there, concurrently, each
// bounded by the node timeout. It succeeds when a quorum extended it
// within the validity (TTL − elapsed − Drift(TTL) > 0). It returns an
// error matching dlock.ErrNotHeld when a quorum of nodes say the token
// does not hold the lock, and otherwise an error joining a summary and one
// *dlock.NodeError per failed node (the lease is then unchanged; the
// Client's watchdog retries). Nodes that lost the lock are not re-acquired.
func (b *Backend) Refresh(ctx context.Context, r dlock.Request) error {
	if err := b.check(ctx, &r, true); err != nil {
		return err
	}
	start := time.Now()
	timeout := b.cfg.timeout(r.TTL)
	deadline := start.Add(timeout)
	nr := nodeRequest(r)
	ans, err := gather(ctx, b, b.all, fan{deadline: deadline, timeout: timeout, detach: true},
		func(ctx context.Context, i int) (struct{}, error) {
			return struct{}{}, b.nodes[i].Refresh(ctx, nr)
		},
		quorumJudge(b.quorum, func(_ struct{}, err error) bool { return err == nil }),
		nil)
	if err != nil {
		return fmt.Errorf("redlock: refresh %q: %w", r.Key, err)
	}
	errs := make([]error, len(b.nodes))
	done := make([]bool, len(b.nodes))
	for i, a := range ans {
		errs[i], done[i] = a.err, a.done
	}
	return b.refreshOutcome(r, start, deadline, timeout, done, errs)
}

// refreshOutcome turns the nodes' answers to one refresh into its result.
func (b *Backend) refreshOutcome(r dlock.Request, start, deadline time.Time, timeout time.Duration, done []bool, errs []error) error {
	ok, notHeld := 0, 0
	for i := range b.nodes {
		switch {
		case !done[i]:
		case errs[i] == nil:
			ok++
		case errors.Is(errs[i], dlock.ErrNotHeld):
			notHeld++
		}
	}
	if ok >= b.quorum {
		if elapsed := time.Since(start); elapsed >= r.TTL-Drift(r.TTL) {
			return fmt.Errorf("redlock: refresh %q: it took %v, leaving no validity of the TTL %v (drift allowance %v)",
				r.Key, elapsed.Round(time.Microsecond), r.TTL, Drift(r.TTL))
		}
		return nil
	}
	ans := make([]answer[struct{}], len(b.nodes))
	for i := range ans {
		ans[i] = answer[struct{}]{done: done[i], err: errs[i]}
	}
	if notHeld >= b.quorum {
		return joinErrs(
			fmt.Errorf("redlock: refresh %q: %w on %d of %d nodes", r.Key, dlock.ErrNotHeld, notHeld, len(b.nodes)),
			nodeErrors(b, b.all, ans, deadline, timeout, isNotHeld))
	}
	return joinErrs(
		fmt.Errorf("redlock: refresh %q: extended on %d of %d nodes (%d do not hold it), the quorum is %d", r.Key, ok, len(b.nodes), notHeld, b.quorum),
		nodeErrors(b, b.all, ans, deadline, timeout, isNotHeld))
}

func isNotHeld(err error) bool { return errors.Is(err, dlock.ErrNotHeld) }

// refreshAllowance is the time RefreshMany allows a node for each
// refresh of a batch, on top of the node timeout: several times what a
// refresh costs end to end (30–70 µs per request on a loopback machine
// whose 2 cores five servers and the client share; 160 µs with the race
// detector), so that a batch of thousands of leases is not failed by a
// timeout meant for one call. Waiting longer costs little: the fan-out
// ends as soon as a quorum has answered, and the watchdog's context ends
// the batch by the earliest expiry in it.
const refreshAllowance = 250 * time.Microsecond

// RefreshMany implements dlock.BatchRefresher: each node refreshes every
// request in one pipeline (redislock's RefreshMany), the nodes
// concurrently, so a batch costs one round trip per node in parallel. Each
// request's result is decided as by Refresh, except that the node timeout
// grows by 250µs per request in the batch: 3,000 leases get the node
// timeout plus 750ms.
func (b *Backend) RefreshMany(ctx context.Context, rs []dlock.Request) []error {
	out := make([]error, len(rs))
	var idx []int
	var sub []dlock.Request
	timeout := time.Duration(0)
	for i := range rs {
		if err := b.check(ctx, &rs[i], true); err != nil {
			out[i] = err
			continue
		}
		idx = append(idx, i)
		sub = append(sub, nodeRequest(rs[i]))
		if t := b.cfg.timeout(rs[i].TTL); timeout == 0 || t < timeout {
			timeout = t
		}
	}
	if len(sub) == 0 {
		return out
	}
	// A node runs the batch's refreshes one after another: give it the
	// node timeout plus refreshAllowance for each. The validity of each
	// refreshed lease counts the time the batch took.
	timeout += time.Duration(len(sub)) * refreshAllowance
	start := time.Now()
	deadline := start.Add(timeout)
	judge := func(ans []answer[[]error], pending int) (met, hopeless bool) {
		met, settled := true, true
		for j := range sub {
			ok := 0
			for _, a := range ans {
				if a.done && a.val[j] == nil {
					ok++
				}
			}
			if ok < b.quorum {
				met = false
				if ok+pending >= b.quorum {
					settled = false
				}
			}
		}
		return met, !met && settled
	}
	ans, err := gather(ctx, b, b.all, fan{deadline: deadline, timeout: timeout, detach: true},
		func(ctx context.Context, i int) ([]error, error) { return b.nodes[i].RefreshMany(ctx, sub), nil },
		judge, nil)
	for j, i := range idx {
		if err != nil {
			out[i] = fmt.Errorf("redlock: refresh %q: %w", rs[i].Key, err)
			continue
		}
		done := make([]bool, len(b.nodes))
		errs := make([]error, len(b.nodes))
		for n, a := range ans {
			if a.done {
				done[n], errs[n] = true, a.val[j]
			}
		}
		out[i] = b.refreshOutcome(rs[i], start, deadline, timeout, done, errs)
	}
	return out
}

// Release implements dlock.Backend: every node gives up one hold of
// r.Token (and r.Fence, when set), concurrently, each bounded by the node
// timeout. It returns nil once a quorum released it (slower nodes still
// get the release); an error matching dlock.ErrNotHeld once more than N −
// quorum nodes do not hold it (the lease had been lost; nodes that still
// held it gave it up); otherwise an error joining a summary and one
// *dlock.NodeError per failed node.
func (b *Backend) Release(ctx context.Context, r dlock.Request) error {
	if err := b.check(ctx, &r, false); err != nil {
		return err
	}
	timeout := b.cfg.timeout(r.TTL)
	deadline := time.Now().Add(timeout)
	// Detached: a node slower than the quorum still gets the release after
	// Release returned.
	nr := nodeRequest(r)
	ans, err := gather(ctx, b, b.all, fan{deadline: deadline, timeout: timeout, detach: true},
		func(ctx context.Context, i int) (struct{}, error) {
			return struct{}{}, b.nodes[i].Release(ctx, nr)
		},
		func(ans []answer[struct{}], _ int) (bool, bool) {
			// Decided once a quorum released it, or once so many do not
			// hold it that no quorum can have.
			released, notHeld := 0, 0
			for _, a := range ans {
				switch {
				case a.done && a.err == nil:
					released++
				case a.done && isNotHeld(a.err):
					notHeld++
				}
			}
			return released >= b.quorum, notHeld > len(b.nodes)-b.quorum
		}, nil)
	released, notHeld := 0, 0
	for _, a := range ans {
		switch {
		case !a.done:
		case a.err == nil:
			released++
		case isNotHeld(a.err):
			notHeld++
		}
	}
	if err != nil {
		return fmt.Errorf("redlock: release %q: %w (released on %d of %d nodes)", r.Key, err, released, len(b.nodes))
	}
	switch {
	case released >= b.quorum:
		return nil
	case notHeld > len(b.nodes)-b.quorum:
		// No quorum held the lease: it had been lost. Stragglers that did
		// hold it (released > 0) have given it up now.
		return joinErrs(
			fmt.Errorf("redlock: release %q: %w by a quorum: released on %d, not held on %d of %d nodes", r.Key, dlock.ErrNotHeld, released, notHeld, len(b.nodes)),
			nodeErrors(b, b.all, ans, deadline, timeout, isNotHeld))
	}
	return joinErrs(
		fmt.Errorf("redlock: release %q: released on %d and not held on %d of %d nodes; the quorum is %d", r.Key, released, notHeld, len(b.nodes), b.quorum),
		nodeErrors(b, b.all, ans, deadline, timeout, isNotHeld))
}

// Close waits for background clean-ups (each bounded by the node timeout),
// then closes every node's redislock.Backend (their subscription
// connections). It does not close the clients passed to New. Later calls
// fail with an error matching dlock.ErrClosed. Close is idempotent.
func (b *Backend) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	b.closed = true
	b.mu.Unlock()
	b.bg.Wait()
	var errs []error
	for i, n := range b.nodes {
		if err := n.Close(); err != nil {
			errs = append(errs, &dlock.NodeError{Node: b.names[i], Err: err})
		}
	}
	return errors.Join(errs...)
}
