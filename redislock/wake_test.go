package redislock_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/redislock"
)

// pubsubConns counts the server's pub/sub connections named name: those
// subscribed to something, or whose last command unsubscribed.
func pubsubConns(t *testing.T, rdb *redis.Client, name string) int {
	t.Helper()
	list, err := rdb.ClientList(context.Background()).Result()
	if err != nil {
		t.Fatalf("CLIENT LIST: %v", err)
	}
	n := 0
	for _, line := range strings.Split(list, "\n") {
		if strings.Contains(line, " name="+name+" ") &&
			(strings.Contains(line, " flags=P") || strings.Contains(line, " cmd=unsubscribe")) {
			n++
		}
	}
	return n
}

// contend makes an attempt by another token on key, which b's caller
// holds: it is not granted, and marks the lock as waited on, so that its
// release is published.
func contend(t *testing.T, b *redislock.Backend, key string) {
	t.Helper()
	other := dlock.Request{Key: key, Token: "other", TTL: time.Second}
	if g, err := b.TryAcquire(ctxT(t, 5*time.Second), other); err != nil || g.OK {
		t.Fatalf("TryAcquire by another token: got %+v, %v, want not granted", g, err)
	}
}

// numSub returns the number of subscribers of a channel.
func numSub(t *testing.T, rdb *redis.Client, channel string) int64 {
	t.Helper()
	m, err := rdb.PubSubNumSub(context.Background(), channel).Result()
	if err != nil {
		t.Fatalf("PUBSUB NUMSUB: %v", err)
	}
	return m[channel]
}

// TestSharedSubscription watches several keys (two watches on one key)
// and counts the Backend's pub/sub connections on the server: exactly one.
// It also checks the per-channel reference counts: one server
// subscription per key, dropped after the last watch stops.
func TestSharedSubscription(t *testing.T) {
	admin := newRDB(t, srv.Addr())
	name := "shared-" + strings.ToLower(key(t)[len(t.Name())+1:])
	rdb := newRDB(t, srv.Addr(), func(o *redis.Options) { o.ClientName = name })
	b := redislock.New(rdb)
	t.Cleanup(func() { b.Close() })
	ctx := ctxT(t, 30*time.Second)

	keys := []string{key(t), key(t), key(t), key(t)}
	var reqs []dlock.Request
	for _, k := range keys {
		r := req(k, time.Minute)
		mustGrant(t, b, r)
		reqs = append(reqs, r)
	}
	// Watches: one per key, plus a second one on keys[0].
	watchKeys := append([]string{keys[0]}, keys...)
	var chans []<-chan struct{}
	var stops []func()
	for _, k := range watchKeys {
		ch, stop, err := b.Watch(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		chans, stops = append(chans, ch), append(stops, stop)
	}
	channel := func(k string) string { return b.LockName(k) + ":rel" }
	for _, k := range keys {
		if n := numSub(t, admin, channel(k)); n != 1 {
			t.Fatalf("NUMSUB %s after Watch returned: got %d, want 1", channel(k), n)
		}
	}
	if n := pubsubConns(t, admin, name); n != 1 {
		t.Fatalf("pub/sub connections of one Backend with %d watches on %d keys: got %d, want 1", len(watchKeys), len(keys), n)
	}
	// Another token finds each lock held, so its release is published.
	for _, r := range reqs {
		contend(t, b, r.Key)
		mustRelease(t, b, r)
	}
	for i, ch := range chans {
		notified(t, ch, fmt.Sprintf("watch %d (%s) of the release", i, watchKeys[i]))
	}
	for _, stop := range stops {
		stop()
	}
	waitFor(t, 5*time.Second, "every channel unsubscribed after the last watch", func() bool {
		for _, k := range keys {
			if numSub(t, admin, channel(k)) != 0 {
				return false
			}
		}
		return true
	})
	if n := pubsubConns(t, admin, name); n != 1 {
		t.Fatalf("pub/sub connections after the watches: got %d, want 1 (kept until Close)", n)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "the pub/sub connection closed by Close", func() bool {
		return pubsubConns(t, admin, name) == 0
	})
	if err := rdb.Ping(ctx).Err(); err != nil {
		t.Fatalf("the go-redis client after Close: %v", err)
	}
}

// TestSubscribeFanOut subscribes twice to one key on one Backend: one
// server subscription, both subscribers notified by a release, and the
// channel stays subscribed until the second one stops.
func TestSubscribeFanOut(t *testing.T) {
	admin := newRDB(t, srv.Addr())
	b := newBackend(t, newRDB(t, srv.Addr()))
	ctx := ctxT(t, 10*time.Second)
	r := req(key(t), time.Minute)
	channel := b.LockName(r.Key) + ":rel"
	ch1, stop1, err := b.Watch(ctx, r.Key)
	if err != nil {
		t.Fatal(err)
	}
	// Subscribe returned: the server has the subscription.
	if n := numSub(t, admin, channel); n != 1 {
		t.Fatalf("NUMSUB after Subscribe returned: got %d, want 1", n)
	}
	ch2, stop2, err := b.Watch(ctx, r.Key)
	if err != nil {
		t.Fatal(err)
	}
	if n := numSub(t, admin, channel); n != 1 {
		t.Fatalf("NUMSUB with two subscribers on one Backend: got %d, want 1", n)
	}
	// An attempt that finds the lock held marks it as waited on: its
	// release is published.
	for i := 0; i < 3; i++ {
		mustGrant(t, b, r)
		contend(t, b, r.Key)
		if err := b.Release(ctx, r); err != nil {
			t.Fatal(err)
		}
		for j, ch := range []<-chan struct{}{ch1, ch2} {
			notified(t, ch, fmt.Sprintf("release %d: subscriber %d", i, j+1))
		}
	}
	// An uncontended release publishes nothing.
	before := cmdCalls(t, admin, "publish")
	mustGrant(t, b, r)
	if err := b.Release(ctx, r); err != nil {
		t.Fatal(err)
	}
	if after := cmdCalls(t, admin, "publish"); after != before {
		t.Fatalf("PUBLISH calls for an uncontended release: got %d, want 0", after-before)
	}
	// A reentrant release that keeps the lock held notifies nobody.
	r.Reentrant = true
	mustGrant(t, b, r)
	mustGrant(t, b, r)
	contend(t, b, r.Key)
	if err := b.Release(ctx, r); err != nil {
		t.Fatal(err)
	}
	if err := b.Release(ctx, r); err != nil {
		t.Fatal(err)
	}
	notified(t, ch1, "last reentrant release")
	select {
	case <-ch1:
		t.Fatal("two notifications for one freeing release")
	default:
	}
	stop1()
	stop1() // idempotent
	if n := numSub(t, admin, channel); n != 1 {
		t.Fatalf("NUMSUB after the first of two stopped: got %d, want 1", n)
	}
	stop2()
	waitFor(t, 5*time.Second, "UNSUBSCRIBE after the last subscriber", func() bool {
		return numSub(t, admin, channel) == 0
	})
	// Subscribe again after the unsubscription.
	_, stop3, err := b.Watch(ctx, r.Key)
	if err != nil {
		t.Fatal(err)
	}
	if n := numSub(t, admin, channel); n != 1 {
		t.Fatalf("NUMSUB after resubscribing: got %d, want 1", n)
	}
	stop3()
}

// TestSubscribeChurn subscribes and unsubscribes one key from many
// goroutines at once: every Subscribe that returns is confirmed (a
// release right after it is seen), and nothing stays subscribed.
func TestSubscribeChurn(t *testing.T) {
	admin := newRDB(t, srv.Addr())
	b := newBackend(t, newRDB(t, srv.Addr()))
	pub := newBackend(t, newRDB(t, srv.Addr()))
	ctx := ctxT(t, 30*time.Second)
	k := key(t)
	var wg sync.WaitGroup
	errc := make(chan error, 8)
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 30; i++ {
				ch, stop, err := b.Watch(ctx, k)
				if err != nil {
					errc <- err
					return
				}
				if i%3 == 0 {
					// The subscription is live: a release is delivered.
					r := dlock.Request{Key: k, Token: "churn", TTL: time.Second, Reentrant: true}
					other := dlock.Request{Key: k, Token: "other", TTL: time.Second}
					if _, err := pub.TryAcquire(ctx, r); err != nil {
						errc <- err
						stop()
						return
					}
					if _, err := pub.TryAcquire(ctx, other); err != nil {
						errc <- err
						stop()
						return
					}
					if err := pub.Release(ctx, r); err != nil && !errors.Is(err, dlock.ErrNotHeld) {
						errc <- err
						stop()
						return
					}
					select {
					case <-ch:
					case <-time.After(5 * time.Second):
						errc <- errors.New("subscription confirmed but a release was not delivered")
						stop()
						return
					}
				}
				stop()
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "no subscription left", func() bool {
		return numSub(t, admin, b.LockName(k)+":rel") == 0
	})
}

// TestWokenByHandOff: a waiter whose strategy would wait 10s between
// attempts (an Acquire without WithFIFO) queues and gets the lock promptly
// when the holder releases it.
func TestWokenByHandOff(t *testing.T) {
	holder := peer(t, dlock.WithTTL(time.Minute))
	waiter := peer(t, dlock.WithWait(dlock.Constant(10*time.Second)))
	s := holdKey(t, holder)
	for i := 0; i < 3; i++ {
		if i > 0 {
			s.h = mustAcquire(t, s.ctx, holder, s.key)
		}
		l, d := s.handOff(t, waiter)
		t.Logf("round %d: waiter acquired %v after the release", i, d)
		if d > 500*time.Millisecond {
			t.Fatalf("waiter acquired %v after the release, want well below its 10s strategy (< 500ms)", d)
		}
		release(t, s.ctx, l)
	}
}

// TestWaitBoundedByHolderTTL: the holder never releases (TTL 300ms, no
// renewal); a waiter with a 10s strategy gets the lock shortly after the
// holder's lease expires: its heartbeat steps (every WithWaiterTTL/4)
// find the lock free.
func TestWaitBoundedByHolderTTL(t *testing.T) {
	const ttl = 300 * time.Millisecond
	holder := peer(t, dlock.WithTTL(ttl), dlock.WithAutoRenew(false))
	waiter := peer(t, dlock.WithWait(dlock.Constant(10*time.Second)))
	ctx := ctxT(t, 30*time.Second)
	k := key(t)
	start := time.Now()
	h := mustAcquire(t, ctx, holder, k)
	l := mustAcquire(t, ctx, waiter, k)
	d := time.Since(start)
	t.Logf("waiter acquired %v after the holder (TTL %v)", d, ttl)
	if l.Fence() <= h.Fence() {
		t.Fatalf("fence: got %d, want > %d", l.Fence(), h.Fence())
	}
	if d < ttl-dlock.Drift(ttl) {
		t.Fatalf("waiter acquired %v after the holder, before its TTL %v ran out", d, ttl)
	}
	if d > ttl+200*time.Millisecond {
		t.Fatalf("waiter acquired %v after the holder, want shortly after its TTL %v (< +200ms), not after the 10s strategy", d, ttl)
	}
	release(t, ctx, l)
}

// TestSubscriptionSurvivesReconnect kills the Backend's pub/sub
// connection on the server: the subscription comes back by itself, the
// waiters are woken (a release may have been missed meanwhile), and later
// releases are delivered again.
func TestSubscriptionSurvivesReconnect(t *testing.T) {
	admin := newRDB(t, srv.Addr())
	name := "reconnect-" + strings.ToLower(key(t)[len(t.Name())+1:])
	rdb := newRDB(t, srv.Addr(), func(o *redis.Options) { o.ClientName = name })
	b := newBackend(t, rdb)
	ctx := ctxT(t, 30*time.Second)
	r := req(key(t), time.Minute)
	ch, stop, err := b.Watch(ctx, r.Key)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	if err := admin.ClientKillByFilter(ctx, "TYPE", "pubsub").Err(); err != nil {
		t.Fatalf("CLIENT KILL TYPE pubsub: %v", err)
	}
	notified(t, ch, "waiter after its subscription was re-established")
	if n := pubsubConns(t, admin, name); n != 1 {
		t.Fatalf("pub/sub connections after the reconnect: got %d, want 1", n)
	}
	mustGrant(t, b, r)
	contend(t, b, r.Key)
	mustRelease(t, b, r)
	notified(t, ch, "release after the reconnect")
}

// TestSubscribeServerDown checks that Subscribe fails promptly, without
// hanging, when the server is down, and works again once it is back.
func TestSubscribeServerDown(t *testing.T) {
	b := newBackend(t, newRDB(t, srv2.Addr()), redislock.WithSubscribeTimeout(500*time.Millisecond))
	ctx := ctxT(t, 30*time.Second)
	k := key(t)
	_, stop, err := b.Watch(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	stop()
	if err := srv2.Kill(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, _, err = b.Watch(ctx, k+"2")
	if err == nil || !strings.Contains(err.Error(), srv2.Addr()) {
		t.Fatalf("Subscribe with the server down: got %v, want an error naming %s", err, srv2.Addr())
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("Subscribe with the server down returned after %v", d)
	}
	if err := srv2.Restart(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "Subscribe to work again", func() bool {
		_, stop, err := b.Watch(ctx, k)
		if err == nil {
			stop()
		}
		return err == nil
	})
}
