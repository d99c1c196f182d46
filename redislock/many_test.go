package redislock_test

import (
	"errors"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/redislock"
)

// TestAcquireMany takes three keys on one server through AcquireMany: in
// ONE request (one script), each lease with its own fence (each key's
// counter issues it; fences of different keys may be equal).
func TestAcquireMany(t *testing.T) {
	hook := &tripHook{}
	rdb := newRDB(t, srv.Addr())
	rdb.AddHook(hookFunc(hook.add))
	b := redislock.New(rdb)
	c := dlock.New(b)
	t.Cleanup(func() { c.Close() })
	ctx := ctxT(t, 10*time.Second)
	keys := []string{key(t), key(t), key(t)}
	if g := b.Groups(keys); len(g) != 1 || !slices.Equal(g[0], keys) {
		t.Fatalf("Groups on a single server: got %v, want one group of all keys", g)
	}
	if err := rdb.Ping(ctx).Err(); err != nil { // dial outside the count
		t.Fatal(err)
	}
	hook.start()
	ls, err := c.AcquireMany(ctx, keys)
	trips := hook.stop()
	if err != nil {
		t.Fatal(err)
	}
	if len(trips) > 2 { // EVALSHA, and EVAL if the script was not loaded yet
		t.Fatalf("requests for AcquireMany of 3 keys: got %d, want 1 (one script)", len(trips))
	}
	for i, l := range ls {
		if l.Key() != keys[i] {
			t.Fatalf("lease %d: key %q, want %q", i, l.Key(), keys[i])
		}
		// Each key has its own fence (from its own counter).
		info, err := b.Inspect(ctx, l.Key())
		if err != nil || info.Owner != l.Owner() || info.Fence != l.Fence() {
			t.Fatalf("lock %q on the server: %+v, %v, want owner %q fence %d", l.Key(), info, err, l.Owner(), l.Fence())
		}
	}
	for _, l := range ls {
		release(t, ctx, l)
	}
}

// TestAcquireManyAllOrNothing: one key of three is held by someone else;
// nothing is taken.
func TestAcquireManyAllOrNothing(t *testing.T) {
	rdb := newRDB(t, srv.Addr())
	b := newBackend(t, rdb)
	var sent atomic.Int64 // the requests of c
	crdb := newRDB(t, srv.Addr())
	crdb.AddHook(countHook(&sent))
	c := dlockClient(t, crdb, redislock.WithClientPool())
	holder := peer(t, dlock.WithTTL(time.Minute))
	ctx := ctxT(t, 10*time.Second)
	keys := []string{key(t), key(t), key(t)}
	slices.Sort(keys)
	h := mustAcquire(t, ctx, holder, keys[1])
	rs := make([]dlock.Request, len(keys))
	for i, k := range keys {
		rs[i] = dlock.Request{Key: k, Token: "many", TTL: time.Minute}
	}
	gs, err := b.TryAcquireAll(ctx, rs)
	if err != nil {
		t.Fatal(err)
	}
	for i, g := range gs {
		if g.OK {
			t.Fatalf("grant %d: OK with key %q held elsewhere, want none", i, keys[1])
		}
	}
	if gs[1].HolderTTL < 30*time.Second || gs[0].HolderTTL != 0 || gs[2].HolderTTL != 0 {
		t.Fatalf("HolderTTLs: got %v %v %v, want 0, ≈1m, 0", gs[0].HolderTTL, gs[1].HolderTTL, gs[2].HolderTTL)
	}
	// Through the Client: it waits, then gives up with nothing held.
	_, err = c.AcquireMany(ctxT(t, 200*time.Millisecond), keys)
	if !errors.Is(err, dlock.ErrNotAcquired) {
		t.Fatalf("AcquireMany with a key held: got %v, want ErrNotAcquired", err)
	}
	noLock(t, rdb, b, "after a failed all-or-nothing attempt", keys[0], keys[2])
	// Released: it goes through, woken by the release.
	before := sent.Load()
	w := make(chan error, 1)
	go func() {
		ls, err := c.AcquireMany(ctx, keys)
		for _, l := range ls {
			err = errors.Join(err, l.Release(ctx))
		}
		w <- err
	}()
	// Released once its first attempt is sent (any phase works).
	waitFor(t, 5*time.Second, "AcquireMany's first attempt", func() bool { return sent.Load() > before })
	release(t, ctx, h)
	select {
	case err := <-w:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("AcquireMany not done within 5s of the release")
	}
}

// TestAcquireManyBadInput: no keys, duplicate keys.
func TestAcquireManyBadInput(t *testing.T) {
	b := newBackend(t, newRDB(t, srv.Addr()))
	c := peer(t)
	ctx := ctxT(t, 5*time.Second)
	k := key(t)
	if _, err := c.AcquireMany(ctx, nil); !errors.Is(err, dlock.ErrInvalidKey) {
		t.Fatalf("AcquireMany(no keys): got %v, want ErrInvalidKey", err)
	}
	if _, err := c.AcquireMany(ctx, []string{k, "x", k}); !errors.Is(err, dlock.ErrInvalidKey) {
		t.Fatalf("AcquireMany(duplicate keys): got %v, want ErrInvalidKey", err)
	}
	if _, err := b.TryAcquireAll(ctx, nil); !errors.Is(err, dlock.ErrInvalidKey) {
		t.Fatalf("TryAcquireAll(no requests): got %v, want ErrInvalidKey", err)
	}
	r := dlock.Request{Key: k, Token: "t", TTL: time.Second}
	if _, err := b.TryAcquireAll(ctx, []dlock.Request{r, r}); !errors.Is(err, dlock.ErrInvalidKey) {
		t.Fatalf("TryAcquireAll(duplicate keys): got %v, want ErrInvalidKey", err)
	}
	if _, err := b.TryAcquireAll(ctx, []dlock.Request{{Key: "", Token: "t", TTL: time.Second}}); !errors.Is(err, dlock.ErrInvalidKey) {
		t.Fatalf("TryAcquireAll(empty key): got %v, want ErrInvalidKey", err)
	}
	if g := b.Groups(nil); len(g) != 0 {
		t.Fatalf("Groups(nil): got %v, want none", g)
	}
}
