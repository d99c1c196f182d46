package etcdlock_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/etcdlock"
	"github.com/dlock-go/dlock/internal/locktest"
)

// rpcCounter counts the requests an etcd client sends, by method name
// (the part after the last "/"): unary calls, and messages sent on
// streams (keep-alives, watch requests); and the watches the server
// confirmed created and cancelled.
type rpcCounter struct {
	calls    locktest.Counts[string] // unary calls
	sends    locktest.Counts[string] // stream messages
	created  atomic.Int32
	canceled atomic.Int32
}

// newCountedClient returns a dlock Client (TTL ttl unless opts say
// otherwise) on an etcdlock Backend over a new etcd connection whose
// requests are counted, closed when the test ends, the counter of that
// connection's requests and the Backend.
func newCountedClient(t testing.TB, opts ...dlock.Option) (*rpcCounter, *dlock.Client, *etcdlock.Backend) {
	t.Helper()
	rc := &rpcCounter{}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   srv.Endpoints(),
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
		DialOptions: []grpc.DialOption{
			grpc.WithChainUnaryInterceptor(rc.intercept),
			grpc.WithChainStreamInterceptor(rc.stream),
		},
	})
	if err != nil {
		t.Fatalf("clientv3.New: %v", err)
	}
	t.Cleanup(func() { cli.Close() })
	b := etcdlock.New(cli)
	c := dlock.New(b, append([]dlock.Option{dlock.WithTTL(ttl)}, opts...)...)
	t.Cleanup(func() { c.Close() })
	return rc, c, b
}

// methodName returns the name of a gRPC method: the part after the last "/".
func methodName(method string) string { return method[strings.LastIndexByte(method, '/')+1:] }

func (c *rpcCounter) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	c.calls.Add(methodName(method))
	return invoker(ctx, method, req, reply, cc, opts...)
}

func (c *rpcCounter) stream(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	s, err := streamer(ctx, desc, cc, method, opts...)
	if err != nil {
		return s, err
	}
	return &countingStream{ClientStream: s, c: c, method: method}, nil
}

// countingStream counts the messages sent on a stream, and the watch
// creations and cancellations it receives.
type countingStream struct {
	grpc.ClientStream
	c      *rpcCounter
	method string
}

func (s *countingStream) SendMsg(m any) error {
	s.c.sends.Add(methodName(s.method))
	return s.ClientStream.SendMsg(m)
}

func (s *countingStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if r, ok := m.(*etcdserverpb.WatchResponse); ok && err == nil {
		if r.Created {
			s.c.created.Add(1)
		}
		if r.Canceled {
			s.c.canceled.Add(1)
		}
	}
	return err
}

// snapshot returns every request counted so far: unary calls (since the
// last calls.Take) and stream messages together.
func (c *rpcCounter) snapshot() map[string]int {
	m := c.sends.Snapshot()
	for k, v := range c.calls.Snapshot() {
		m[k] += v
	}
	return m
}

// TestThirdInLineGrantedWithoutRead checks the hand-off shortcut of a
// waiter third in line: when the holder releases, it reads its position
// once (while the next waiter holds the lock) and finds its predecessor at
// the head; the predecessor's release then grants it with no further
// request.
func TestThirdInLineGrantedWithoutRead(t *testing.T) {
	const rangeCall = "Range"
	key := locktest.Key(t)
	cli := newCli(t, srv.Endpoints())
	hc, _ := newClient(t, srv.Endpoints())
	ctx := locktest.Ctx(t, time.Minute)
	holder := locktest.MustAcquire(t, ctx, hc, key)
	c1, _ := newClient(t, srv.Endpoints())
	first := locktest.Go(func() (*dlock.Lease, error) { return c1.Acquire(ctx, key) })
	locktest.WaitFor(t, 10*time.Second, "first waiter queued", func() bool { return entries(t, cli, key) == 2 })

	counter, c2, _ := newCountedClient(t, dlock.WithTTL(10*time.Second))
	type result struct {
		l     *dlock.Lease
		calls map[string]int // calls from the first waiter's release on
		err   error
	}
	second := make(chan result, 1)
	go func() {
		l, err := c2.Acquire(ctx, key)
		second <- result{l, counter.calls.Take(), err}
	}()
	// Queued third, it watches its predecessor and the holder's entry
	// (and keeps its watch stream open with one more watch).
	locktest.WaitFor(t, 10*time.Second, "the third waiter's watches", func() bool { return counter.created.Load() == 3 })

	reads := counter.calls.Get(rangeCall)
	if err := holder.Release(ctx); err != nil {
		t.Fatalf("Release holder: %v", err)
	}
	l1 := locktest.Granted(t, first, time.Minute)
	// The holder's entry is gone: the third waiter reads its position
	// again (one Range).
	locktest.WaitFor(t, 10*time.Second, "the third waiter's read", func() bool { return counter.calls.Get(rangeCall) > reads })
	counter.calls.Take()
	if err := l1.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
	r := <-second
	if r.err != nil {
		t.Fatalf("third waiter: %v", r.err)
	}
	defer r.l.Release(context.Background())
	if len(r.calls) != 0 {
		t.Fatalf("calls of the third waiter after its predecessor's release: got %v, want none", r.calls)
	}
}

// TestWaitReusesEntryWatches checks that a Backend waiting again behind
// the same entry (the holder's Backend reuses its key) reuses its watch of
// that entry: the second wait creates no watch and reads nothing but the
// transaction that queues it (the watch predates that read, so it cannot
// have missed a deletion); and that the watch is cancelled once no wait
// has needed it for the linger time, while the one keeping the watch
// stream open stays.
func TestWaitReusesEntryWatches(t *testing.T) {
	const rangeCall = "Range"
	key := locktest.Key(t)
	cli := newCli(t, srv.Endpoints())
	hc, hb := newClient(t, srv.Endpoints())
	etcdlock.SetEntryWatchLinger(hb, time.Minute)
	counter, wc, wb := newCountedClient(t, dlock.WithTTL(10*time.Second))
	etcdlock.SetEntryWatchLinger(wb, time.Minute)
	ctx := locktest.Ctx(t, time.Minute)
	for round := range 2 {
		holder, err := hc.Acquire(ctx, key)
		if err != nil {
			t.Fatalf("round %d: Acquire holder: %v", round, err)
		}
		created := counter.created.Load()
		counter.calls.Take()
		type result struct {
			l   *dlock.Lease
			err error
		}
		waited := make(chan result, 1)
		go func() {
			l, err := wc.Acquire(ctx, key)
			waited <- result{l, err}
		}()
		locktest.WaitFor(t, 10*time.Second, "waiter queued", func() bool { return entries(t, cli, key) == 2 })
		if round == 0 {
			// The watch of the holder's entry, and the stream's anchor.
			locktest.WaitFor(t, 10*time.Second, "the waiter's watches", func() bool { return counter.created.Load() == created+2 })
		}
		if err := holder.Release(ctx); err != nil {
			t.Fatalf("round %d: Release holder: %v", round, err)
		}
		r := <-waited
		if r.err != nil {
			t.Fatalf("round %d: waiter: %v", round, r.err)
		}
		calls := counter.calls.Take()
		if err := r.l.Release(ctx); err != nil {
			t.Fatalf("round %d: Release waiter: %v", round, err)
		}
		if round == 1 {
			if n := counter.created.Load() - created; n != 0 {
				t.Fatalf("watches created by the second wait: got %d, want 0", n)
			}
			if calls[rangeCall] != 0 {
				t.Fatalf("reads by the second wait: got %v, want no %s", calls, rangeCall)
			}
		}
	}
	if n := counter.canceled.Load(); n != 0 {
		t.Fatalf("watches cancelled within the linger time: got %d, want 0", n)
	}
	// The holder's entry is deleted (and created again) while the watch is
	// idle: the next wait reuses the watch and must take that old deletion
	// for what it is, not for the release of the entry it reads now.
	holder := locktest.MustAcquire(t, ctx, hc, key)
	if err := holder.Release(ctx); err != nil {
		t.Fatalf("Release holder: %v", err)
	}
	holder, err := hc.Acquire(ctx, key)
	if err != nil {
		t.Fatalf("Acquire holder: %v", err)
	}
	created := counter.created.Load()
	waited := locktest.Go(func() (*dlock.Lease, error) { return wc.Acquire(ctx, key) })
	locktest.WaitFor(t, 10*time.Second, "waiter queued", func() bool { return entries(t, cli, key) == 2 })
	// A waiter misled by the old deletion would be granted within a few
	// milliseconds.
	locktest.NotWithin(t, waited, 100*time.Millisecond, "waiter while the holder holds the lock")
	if err := holder.Release(ctx); err != nil {
		t.Fatalf("Release holder: %v", err)
	}
	if err := locktest.Granted(t, waited, 30*time.Second).Release(ctx); err != nil {
		t.Fatalf("Release waiter: %v", err)
	}
	if n := counter.created.Load() - created; n != 0 {
		t.Fatalf("watches created by the third wait: got %d, want 0", n)
	}
}

// TestIdleEntryWatchExpires checks that a Backend's watch of an entry it
// waited behind is cancelled once no wait has needed it for the linger
// time.
func TestIdleEntryWatchExpires(t *testing.T) {
	key := locktest.Key(t)
	cli := newCli(t, srv.Endpoints())
	hc, hb := newClient(t, srv.Endpoints())
	etcdlock.SetEntryWatchLinger(hb, 50*time.Millisecond)
	counter, wc, wb := newCountedClient(t, dlock.WithTTL(10*time.Second))
	etcdlock.SetEntryWatchLinger(wb, 50*time.Millisecond)
	ctx := locktest.Ctx(t, time.Minute)
	holder := locktest.MustAcquire(t, ctx, hc, key)
	waited := make(chan error, 1)
	go func() {
		l, err := wc.Acquire(ctx, key)
		if err == nil {
			err = l.Release(ctx)
		}
		waited <- err
	}()
	locktest.WaitFor(t, 10*time.Second, "waiter queued", func() bool { return entries(t, cli, key) == 2 })
	locktest.WaitFor(t, 10*time.Second, "the waiter's watches", func() bool { return counter.created.Load() == 2 })
	if err := holder.Release(ctx); err != nil {
		t.Fatalf("Release holder: %v", err)
	}
	if err := <-waited; err != nil {
		t.Fatalf("waiter: %v", err)
	}
	if n := counter.canceled.Load(); n != 0 {
		t.Fatalf("watches cancelled right after the wait: got %d, want 0", n)
	}
	locktest.WaitFor(t, 10*time.Second, "the idle watch cancelled", func() bool { return counter.canceled.Load() == 1 })
}

// TestEntryKeyReused checks that a Backend taking the same lock again and
// again reuses one etcd key (a new key per acquisition would leave one
// more dead key in etcd's index, which every read of the queue walks),
// and that acquisitions in flight at the same time through one Backend get
// distinct keys.
func TestEntryKeyReused(t *testing.T) {
	key := locktest.Key(t)
	c, b := newClient(t, srv.Endpoints())
	ctx := locktest.Ctx(t, 30*time.Second)
	first := ""
	for i := range 5 {
		l, err := c.Acquire(ctx, key)
		if err != nil {
			t.Fatalf("Acquire %d: %v", i, err)
		}
		name := b.LockKey(l.Key(), l.Owner())
		if first == "" {
			first = name
		}
		if name != first {
			t.Fatalf("etcd key of acquisition %d: got %s, want %s (the first one's)", i, name, first)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatalf("Release %d: %v", i, err)
		}
	}
	held := locktest.MustAcquire(t, ctx, c, key)
	queued := locktest.Go(func() (*dlock.Lease, error) { return c.Acquire(ctx, key) })
	cli := newCli(t, srv.Endpoints())
	locktest.WaitFor(t, 10*time.Second, "second acquisition queued", func() bool { return entries(t, cli, key) == 2 })
	if err := held.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
	l := locktest.Granted(t, queued, time.Minute)
	if name := b.LockKey(l.Key(), l.Owner()); name == first {
		t.Fatalf("etcd key of an acquisition queued behind a hold of the same Backend: got %s, want another than the hold's", name)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
}

// TestLeftoverInSlotIsRemoved puts a foreign value under the etcd key a
// Backend reuses for a lock (as if an earlier entry of it had survived
// unnoticed); the next acquisition must not mistake it for its own: the
// leftover is deleted and the lock granted on an entry of its own (under
// another key, or under the same key created anew once the leftover is
// gone: an acquisition that first tries the lock finds the leftover and
// deletes it before it queues).
func TestLeftoverInSlotIsRemoved(t *testing.T) {
	key := locktest.Key(t)
	cli := newCli(t, srv.Endpoints())
	c, b := newClient(t, srv.Endpoints())
	ctx := locktest.Ctx(t, 30*time.Second)
	l := locktest.MustAcquire(t, ctx, c, key)
	slot := b.LockKey(l.Key(), l.Owner())
	if err := l.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
	put, err := cli.Put(ctx, slot, "1 someone-else")
	if err != nil {
		t.Fatalf("Put: %v", err)
	}
	leftover := put.Header.Revision
	l, err = c.Acquire(ctx, key)
	if err != nil {
		t.Fatalf("Acquire over a leftover: %v", err)
	}
	defer l.Release(context.Background())
	name := b.LockKey(l.Key(), l.Owner())
	own, err := cli.Get(ctx, name)
	if err != nil || len(own.Kvs) != 1 {
		t.Fatalf("entry %s of the acquisition: got %v (err %v), want one", name, own, err)
	}
	if kv := own.Kvs[0]; kv.CreateRevision == leftover || kv.CreateRevision != int64(l.Fence()) || string(kv.Value) != "1 "+l.Owner() {
		t.Fatalf("entry %s of the acquisition: created at %d with %q, want created at its fence %d (not the leftover's %d) with its own token",
			name, kv.CreateRevision, kv.Value, l.Fence(), leftover)
	}
	if name == slot {
		return // the leftover was deleted before the new entry was created
	}
	resp, err := cli.Get(ctx, slot)
	if err != nil || len(resp.Kvs) != 0 {
		t.Fatalf("leftover after the acquisition: got %v (err %v), want deleted", resp.Kvs, err)
	}
}
