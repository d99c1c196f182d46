package redlock

import (
	"context"
	_ "embed"
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
	//go:embed writeback.lua
	writebackSrc    string
	writebackScript = redis.NewScript(writebackSrc)
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
	err    error // from NewWithOptions: returned by every call

	// floor is the last fence floor proposed (see propose); ahead how far
	// (µs) the nodes' fences were seen ahead of this process's clock.
	floor atomic.Uint64
	ahead atomic.Int64

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
	b := &Backend{cfg: defaultConfig()}
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
		name := nodeName(c)
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
		b.cte = append(b.cte, contextTimeouts(c))
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

// nodeName returns the address of the server behind c, or "" when c does
// not tell (a Sentinel-managed client reports "FailoverClient").
func nodeName(c redislock.Client) string {
	switch c := c.(type) {
	case interface{ Options() *redis.Options }:
		if a := c.Options().Addr; a != "FailoverClient" {
			return a
		}
	case interface{ Options() *redis.ClusterOptions }:
		return strings.Join(c.Options().Addrs, ",")
	}
	return ""
}

// contextTimeouts reports whether c bounds socket I/O by a context's
// deadline (go-redis ContextTimeoutEnabled).
func contextTimeouts(c redislock.Client) bool {
	switch c := c.(type) {
	case interface{ Options() *redis.Options }:
		return c.Options().ContextTimeoutEnabled
	case interface{ Options() *redis.ClusterOptions }:
		return c.Options().ContextTimeoutEnabled
	}
	return false
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
// floor (see propose), which no other attempt of any lease shares, so a
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

// propose returns the fence floor of a non-reentrant attempt: this
// process's clock in µs, plus how far ahead the nodes' fences were seen,
// plus proposeMargin, and above every floor proposed or fence seen before.
// The nodes issue max(counter + 1, server time in µs, floor): when every
// node issues exactly the floor, the nodes agree without a write-back.
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

// learn records the fences of an attempt that proposed floor at sent: the
// next floor is above them, and a node that issued more than the floor
// (its counter or clock ahead of this process's) raises ahead by as much.
func (b *Backend) learn(sent time.Time, floor uint64, acq []answer[dlock.Grant]) {
	for _, a := range acq {
		if !a.done || a.err != nil || !a.val.OK {
			continue
		}
		f := a.val.Fence
		raise(&b.floor, f)
		if f > floor {
			raise(&b.ahead, int64(f)-sent.UnixMicro())
		}
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

// hold is what one node may hold after a failed or partly failed attempt,
// to be undone.
type hold struct {
	granted bool   // the node granted the lock to the attempt's token
	maybe   bool   // the node did not answer clearly: a grant may have landed
	fence   uint64 // the node's fence for the attempt's grant, 0 if unknown
	lease   bool   // the write-back may have renamed the owner to the lease's token
	renamed bool   // the write-back renamed it (confirmed)
	answer  bool   // the node answered the last call: undo it synchronously
}

// TryAcquire implements dlock.Backend: one Redlock attempt.
//
//  1. Every node runs redislock's acquire script concurrently, each call
//     bounded by the node timeout (WithNodeTimeout). The script advances
//     the node's fence counter to max(counter+1, server TIME in µs,
//     floor) and returns it, where a non-reentrant attempt proposes the
//     floor (see propose).
//  2. Once a quorum granted (and the other nodes answered or had a short
//     grace, see below): if every node answered and every grant carries
//     exactly the floor, the floor is the fence and the nodes agree
//     already. Otherwise the fence is the maximum over the granting nodes
//     (one more if that is the floor; for a reentrant re-entry: the fence
//     the holder already has). It is written back to every node that
//     answered: counter = max(counter, fence), and where the attempt holds
//     the lock, the lock's owner becomes the lease's node token and its
//     fence field the fence. The lease needs a quorum of nodes confirming
//     that they hold it with that fence.
//  3. The attempt succeeds if its validity TTL − elapsed − Drift(TTL),
//     elapsed measured from before step 1, is still positive.
//
// It fails fast: as soon as a quorum can no longer be reached (and the
// slow nodes could not change whether that is contention or a failure) it
// stops waiting for the slow nodes. Once the outcome is decided, either
// way, slower nodes get a grace of as long as the decision took (at least
// 2ms): after a grant they take part in the lease, after a failure their
// grants are undone at once.
//
// On a failed attempt it releases the lock on every node the attempt may
// have touched, including those that did not answer in time (their grant
// may still land; a late grant is given back too): synchronously on the
// nodes that answered, in the background (bounded by the node timeout,
// awaited by Close) on the others. A non-reentrant attempt uses its own
// owner token on the nodes, nodeToken(token, floor), and the lease holds
// them as nodeToken(token, fence): a straggling command of an earlier
// attempt can never touch a later grant (see nodeToken).
//
// When fewer than a quorum of nodes grant the lock because other tokens
// hold it on the rest (contention, or a split vote between contenders),
// TryAcquire returns Grant{OK: false} with HolderTTL the time until enough
// of them expire, so the Client waits and retries. When more than N −
// quorum nodes fail (an error, or no reply within the node timeout), so
// that no quorum could grant the lock, it returns an error joining a
// summary and one *dlock.NodeError per failed node. An attempt that took
// longer than the validity allows fails with an error matching
// dlock.ErrNotAcquired.
func (b *Backend) TryAcquire(ctx context.Context, r dlock.Request) (dlock.Grant, error) {
	if err := b.check(ctx, &r, true); err != nil {
		return dlock.Grant{}, err
	}
	start := time.Now()
	timeout := b.cfg.timeout(r.TTL)
	nr := r // what the nodes see
	nr.Fence = 0
	var floor uint64
	if !r.Reentrant {
		floor = b.propose()
		nr.Token, nr.Fence = nodeToken(r.Token, floor), floor
	}
	deadline := start.Add(timeout)
	// A grant that comes after the fan-out gave up on its node is given
	// back: the node is not part of the lease. Except a re-entry (count >
	// 1) for a reentrant attempt that succeeded: it added one hold to an
	// earlier one, as on the other nodes, and the lease's release takes it
	// back.
	decided := make(chan struct{})
	var won bool
	defer close(decided)
	lateGrant := func(i int, g dlock.Grant, err error) {
		if err != nil || !g.OK {
			return
		}
		if r.Reentrant {
			if <-decided; won && g.Count > 1 {
				return
			}
			g.Fence = 0
		}
		rr := nr
		rr.Fence = g.Fence
		b.background(func() {
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			_ = b.nodes[i].Release(ctx, rr)
		})
	}
	acq, err := gather(ctx, b, b.all, fan{deadline: deadline, timeout: timeout, grace: true},
		func(ctx context.Context, i int) (dlock.Grant, error) { return b.nodes[i].TryAcquire(ctx, nr) },
		b.acquireJudge, lateGrant)
	holds := make([]hold, len(b.nodes))
	granted, failures := 0, 0
	for i, a := range acq {
		switch {
		case a.done && a.err == nil && a.val.OK:
			holds[i] = hold{granted: true, fence: a.val.Fence, answer: true}
			granted++
		case a.done && a.err == nil:
			holds[i] = hold{answer: true} // held by another token: nothing to undo
		default:
			holds[i] = hold{maybe: true, answer: a.done}
			if failed(a, deadline) {
				failures++
			}
		}
	}
	if err != nil {
		b.undo(r, nr, 0, holds, timeout)
		return dlock.Grant{}, fmt.Errorf("redlock: acquire %q: %w", r.Key, err)
	}
	if granted < b.quorum {
		b.undo(r, nr, 0, holds, timeout)
		if failures > len(b.nodes)-b.quorum {
			// Not contention: too few nodes work for any quorum.
			return dlock.Grant{}, joinErrs(
				fmt.Errorf("redlock: acquire %q: %d of %d nodes failed, so no quorum of %d can grant it", r.Key, failures, len(b.nodes), b.quorum),
				nodeErrors(b, b.all, acq, deadline, timeout, nil))
		}
		return dlock.Grant{HolderTTL: holderTTL(acq, b.quorum-granted)}, nil
	}

	fence, count := settle(acq, b.quorum)
	if !r.Reentrant {
		b.learn(start, floor, acq)
		if agreed(holds, acq, floor) {
			// Every node answered and every grant has the floor as its
			// fence: the granting nodes, a quorum, hold the lease under
			// its node token with its fence, and their counters are at the
			// fence. That is what the write-back would make; nothing of the
			// attempt is left to undo.
			if elapsed := time.Since(start); elapsed >= r.TTL-Drift(r.TTL) {
				b.undo(r, nr, 0, holds, timeout)
				return dlock.Grant{}, fmt.Errorf("redlock: acquire %q: %w: it took %v, leaving no validity of the TTL %v (drift allowance %v)",
					r.Key, dlock.ErrNotAcquired, elapsed.Round(time.Microsecond), r.TTL, Drift(r.TTL))
			}
			won = true
			return dlock.Grant{OK: true, Fence: floor, Count: 1, Since: start}, nil
		}
		if fence == floor {
			// The lease's node token must differ from the attempt's, which
			// late grants on nodes that did not answer may still carry.
			fence++
		}
	}
	leaseToken := nodeRequest(dlock.Request{Token: r.Token, Reentrant: r.Reentrant, Fence: fence}).Token

	// The write-back, to every node that answered: a later quorum
	// intersects the nodes that confirm it, so it sees a counter ≥ fence.
	var targets []int
	for i, h := range holds {
		if h.answer {
			targets = append(targets, i)
		}
	}
	lock := b.nodes[0].LockName(r.Key)
	fenceStr := strconv.FormatUint(fence, 10)
	wbDeadline := time.Now().Add(timeout)
	// A write-back that comes after the fan-out gave up on its node: the
	// node is not part of the lease (nobody knows it holds it), so a
	// non-reentrant attempt gives it back, whether it was renamed or the
	// reply was lost. A reentrant token's hold there is the lease's.
	attemptFences := make([]uint64, len(holds)) // holds changes meanwhile
	for i, h := range holds {
		attemptFences[i] = h.fence
	}
	lateWriteBack := func(i int, v int64, err error) {
		if r.Reentrant || (err == nil && v == 0) {
			return
		}
		b.background(func() {
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			if err != nil {
				_ = b.nodes[i].Release(ctx, dlock.Request{Key: r.Key, Token: nr.Token, TTL: r.TTL, Fence: attemptFences[i]})
			}
			_ = b.nodes[i].Release(ctx, dlock.Request{Key: r.Key, Token: leaseToken, TTL: r.TTL, Fence: fence})
		})
	}
	wb, err := gather(ctx, b, targets, fan{deadline: wbDeadline, timeout: timeout, grace: true},
		func(ctx context.Context, i int) (int64, error) {
			return b.writeBack(ctx, i, lock, nr.Token, leaseToken, fenceStr)
		},
		quorumJudge(b.quorum, func(v int64, err error) bool { return err == nil && v == 1 }),
		lateWriteBack)
	renamed := 0
	for _, i := range targets {
		h := &holds[i]
		a := wb[i]
		h.answer = a.done
		switch {
		case a.done && a.err == nil && a.val == 1:
			h.renamed, h.lease = true, true
			renamed++
		case a.done && a.err == nil:
			h.granted = false // not held by the attempt (any more): nothing to undo
		case h.granted && a.done:
			// Failed: renamed or not, undo both ways (in that order, which
			// is right whenever the rename landed).
			h.lease = true
		case h.granted && !r.Reentrant:
			h.granted = false // still on its way: lateWriteBack undoes it
		}
	}
	if err != nil {
		b.undo(r, nr, fence, holds, timeout)
		return dlock.Grant{}, fmt.Errorf("redlock: acquire %q: %w", r.Key, err)
	}
	if renamed < b.quorum {
		b.undo(r, nr, fence, holds, timeout)
		return dlock.Grant{}, joinErrs(
			fmt.Errorf("redlock: acquire %q: the fence write-back was confirmed by %d of %d nodes, the quorum is %d", r.Key, renamed, len(b.nodes), b.quorum),
			nodeErrors(b, targets, wb, wbDeadline, timeout, nil))
	}
	if elapsed := time.Since(start); elapsed >= r.TTL-Drift(r.TTL) {
		b.undo(r, nr, fence, holds, timeout)
		return dlock.Grant{}, fmt.Errorf("redlock: acquire %q: %w: it took %v, leaving no validity of the TTL %v (drift allowance %v)",
			r.Key, dlock.ErrNotAcquired, elapsed.Round(time.Microsecond), r.TTL, Drift(r.TTL))
	}
	// Held. Nodes that may hold the attempt without being part of the
	// lease (no answer to the acquire, a failed write-back) are given back
	// in the background. A reentrant token owns its holds whatever the
	// write-back did: they are the lease's, released with it.
	if !r.Reentrant {
		for i := range holds {
			h := &holds[i]
			if h.renamed {
				*h = hold{}
				continue
			}
			h.lease = false
			h.answer = false
		}
		b.undo(r, nr, fence, holds, timeout)
	}
	won = true
	return dlock.Grant{OK: true, Fence: fence, Count: count, Since: start}, nil
}

// acquireJudge decides an acquisition's first phase: met with a quorum of
// grants; hopeless (fail fast) once a quorum can no longer grant it and
// the slow nodes cannot change what the failure is: more than N − quorum
// nodes failed (an error), or so few failed that even if every slow node
// fails too it is contention.
func (b *Backend) acquireJudge(ans []answer[dlock.Grant], pending int) (met, hopeless bool) {
	granted, failures := 0, 0
	for _, a := range ans {
		switch {
		case !a.done:
		case a.err != nil:
			failures++
		case a.val.OK:
			granted++
		}
	}
	spare := len(b.nodes) - b.quorum
	decided := failures > spare || failures+pending <= spare
	return granted >= b.quorum, granted+pending < b.quorum && decided
}

// settle returns the fence and hold count of a grant on a quorum: the
// maximum fence over the granting nodes, count 1. A re-entry, where a
// quorum of nodes count an earlier hold (count > 1), keeps the holder's
// fence instead: the fence most of those nodes report (the lease's,
// written back to a quorum; a node that joined the hold later, after a
// restart, reports another), ties going to the higher, with the highest
// count they report. Fewer than a quorum of earlier holds is no hold: the
// grant is a first one (the Client then reports its earlier reentrant
// leases lost). Nodes that granted afresh are brought in line by the
// write-back.
func settle(acq []answer[dlock.Grant], quorum int) (fence uint64, count int) {
	votes := make(map[uint64]int)
	held := 0
	for _, a := range acq {
		if a.done && a.err == nil && a.val.OK && a.val.Count > 1 {
			votes[a.val.Fence]++
			held++
		}
	}
	if held < quorum {
		for _, a := range acq {
			if a.done && a.err == nil && a.val.OK {
				fence = max(fence, a.val.Fence)
			}
		}
		return fence, 1
	}
	for f, n := range votes {
		if n > votes[fence] || n == votes[fence] && f > fence {
			fence = f
		}
	}
	for _, a := range acq {
		if a.done && a.err == nil && a.val.OK && a.val.Fence == fence {
			count = max(count, a.val.Count)
		}
	}
	return fence, count
}

// agreed reports whether an attempt that proposed floor can skip the
// write-back: every node answered (no grant may still land anywhere) and
// every grant is a fresh one with the floor as its fence.
func agreed(holds []hold, acq []answer[dlock.Grant], floor uint64) bool {
	for i, a := range acq {
		if holds[i].maybe || !a.done {
			return false
		}
		if a.err == nil && a.val.OK && (a.val.Fence != floor || a.val.Count != 1) {
			return false
		}
	}
	return true
}

// holderTTL returns how long until need more nodes could be free: the
// n-th shortest remaining TTL among the nodes held by another token, where
// n is need less the nodes that did not answer (they may be free), or 0 if
// that is unknown. An underestimate costs the waiter an early retry; an
// overestimate, a late one when a release notification is lost.
func holderTTL(acq []answer[dlock.Grant], need int) time.Duration {
	var ttls []time.Duration
	for _, a := range acq {
		switch {
		case !a.done || a.err != nil:
			need--
		case !a.val.OK && a.val.HolderTTL > 0:
			ttls = append(ttls, a.val.HolderTTL)
		}
	}
	if need <= 0 || len(ttls) < need {
		return 0
	}
	slices.Sort(ttls)
	return ttls[need-1]
}

// writeBack runs writeback.lua on node i.
func (b *Backend) writeBack(ctx context.Context, i int, lock, from, to, fence string) (int64, error) {
	v, err := writebackScript.Run(ctx, b.rdbs[i], []string{lock, lock + ":fence"}, from, to, fence).Result()
	if err != nil {
		return 0, fmt.Errorf("redlock: fence write-back on %s: %w", b.names[i], err)
	}
	switch v := v.(type) {
	case int64:
		if v == 0 || v == 1 {
			return v, nil
		}
	case []any:
		if len(v) == 3 && v[0] == int64(-1) {
			return 0, fmt.Errorf("redlock: key %q on %s holds a %v, not a dlock lock; nothing was changed: %w", v[1], b.names[i], v[2], dlock.ErrWrongType)
		}
	}
	return 0, fmt.Errorf("redlock: fence write-back on %s: unexpected reply %v from the script", b.names[i], v)
}

// undo releases what a failed attempt may hold (see hold): synchronously
// on the nodes that answered, in the background on the others. A
// reentrant attempt shares its token with the holds it re-entered, so it
// gives back exactly one hold, and only where a grant is certain.
func (b *Backend) undo(r, nr dlock.Request, fence uint64, holds []hold, timeout time.Duration) {
	var wait sync.WaitGroup
	for i, h := range holds {
		var reqs []dlock.Request
		switch {
		case r.Reentrant:
			if h.granted || h.renamed {
				reqs = append(reqs, dlock.Request{Key: r.Key, Token: r.Token, TTL: r.TTL})
			}
		default:
			if (h.granted || h.maybe) && !h.renamed {
				f := h.fence
				if h.maybe {
					f = 0 // unknown: any fence of this attempt's unique token
				}
				reqs = append(reqs, dlock.Request{Key: r.Key, Token: nr.Token, TTL: r.TTL, Fence: f})
			}
			if h.lease {
				reqs = append(reqs, nodeRequest(dlock.Request{Key: r.Key, Token: r.Token, TTL: r.TTL, Fence: fence}))
			}
		}
		if len(reqs) == 0 {
			continue
		}
		if h.answer {
			wait.Add(1)
		}
		ok := b.background(func() {
			if h.answer {
				defer wait.Done()
			}
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			for _, q := range reqs {
				_ = b.nodes[i].Release(ctx, q)
			}
		})
		if !ok {
			if h.answer {
				wait.Done()
			}
			break
		}
	}
	wait.Wait()
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
	ans, err := gather(ctx, b, b.all, fan{deadline: deadline, timeout: timeout, detach: true},
		func(ctx context.Context, i int) (struct{}, error) {
			return struct{}{}, b.nodes[i].Refresh(ctx, nodeRequest(r))
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
// timeout. It returns nil as soon as a quorum answered and one of them
// released the lock (the slower nodes still get the release after it
// returned); an error matching dlock.ErrNotHeld when no node that
// answered held it and a quorum answered; otherwise an error joining a
// summary and one *dlock.NodeError per failed node (the lock then expires
// with its TTL where it could not be released).
func (b *Backend) Release(ctx context.Context, r dlock.Request) error {
	if err := b.check(ctx, &r, false); err != nil {
		return err
	}
	timeout := b.cfg.timeout(r.TTL)
	deadline := time.Now().Add(timeout)
	// Detached: a node slower than the quorum still gets the release after
	// Release returned.
	ans, err := gather(ctx, b, b.all, fan{deadline: deadline, timeout: timeout, detach: true},
		func(ctx context.Context, i int) (struct{}, error) {
			return struct{}{}, b.nodes[i].Release(ctx, nodeRequest(r))
		},
		func(ans []answer[struct{}], _ int) (bool, bool) {
			// Decided once a quorum answered and one of them released it;
			// "not held" from a quorum waits for the others, in case one of
			// them held it.
			n, released := 0, 0
			for _, a := range ans {
				if a.done && a.err == nil {
					released++
				}
				if a.done && (a.err == nil || isNotHeld(a.err)) {
					n++
				}
			}
			return n >= b.quorum && released > 0, false
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
	case released > 0 && released+notHeld >= b.quorum:
		return nil
	case released == 0 && notHeld >= b.quorum:
		return joinErrs(
			fmt.Errorf("redlock: release %q: %w on any of the %d nodes that answered", r.Key, dlock.ErrNotHeld, notHeld),
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
