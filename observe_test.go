package dlock_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/locktest"
	"github.com/dlock-go/dlock/memlock"
)

type recorder struct {
	mu     sync.Mutex
	events []dlock.Event
}

func (r *recorder) Observe(ctx context.Context, e dlock.Event) context.Context {
	r.mu.Lock()
	r.events = append(r.events, e)
	r.mu.Unlock()
	return ctx
}

func (r *recorder) kinds() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, e := range r.events {
		out = append(out, e.Kind.String())
	}
	return out
}

func (r *recorder) count(k dlock.EventKind) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, e := range r.events {
		if e.Kind == k {
			n++
		}
	}
	return n
}

func TestObserverSequence(t *testing.T) {
	synctest.Test(t, testObserverSequence)
}

func testObserverSequence(t *testing.T) {
	store := memlock.NewStore()
	rec := &recorder{}
	ttl := 60 * time.Millisecond
	c := dlock.New(store.Backend(), dlock.WithTTL(ttl), dlock.WithObserver(rec))
	defer c.Close()
	ctx := context.Background()

	hc := dlock.New(store.Backend(), dlock.WithTTL(ttl), dlock.WithAutoRenew(false))
	defer hc.Close()
	if _, err := hc.Acquire(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	l, err := c.Acquire(ctx, "k") // waits for the holder's expiry
	if err != nil {
		t.Fatal(err)
	}
	locktest.WaitFor(t, ttl, "two renewals, every TTL/3", func() bool { return rec.count(dlock.EventRenewed) >= 2 })
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	got := strings.Join(rec.kinds(), ",")
	want := "acquire_start,attempt,attempt,wait_start,attempt,"
	if !strings.HasPrefix(got, want) || !strings.Contains(got, "wait_end,acquire_end,renewed,renewed") || !strings.HasSuffix(got, "released") {
		t.Fatalf("events: got %s, want acquire_start,attempt,attempt,wait_start,attempt…,wait_end,acquire_end,renewed,renewed…,released", got)
	}
}

func TestObserverLost(t *testing.T) {
	store := memlock.NewStore()
	rec := &recorder{}
	c := dlock.New(store.Backend(), dlock.WithTTL(30*time.Millisecond), dlock.WithAutoRenew(false), dlock.WithObserver(rec))
	defer c.Close()
	l, _ := c.Acquire(context.Background(), "k")
	<-l.Done()
	if n := rec.count(dlock.EventLost); n != 1 {
		t.Fatalf("lost events: got %d, want 1", n)
	}
	rec.mu.Lock()
	e := rec.events[len(rec.events)-1]
	rec.mu.Unlock()
	if e.Kind != dlock.EventLost || e.Lease != l || !errors.Is(e.Err, dlock.ErrLost) || e.Duration <= 0 {
		t.Fatalf("lost event: got %+v", e)
	}
}

func TestLogger(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelWarn}))
	c := dlock.New(memlock.New(), dlock.WithTTL(30*time.Millisecond), dlock.WithAutoRenew(false), dlock.WithLogger(log))
	defer c.Close()
	l, _ := c.Acquire(context.Background(), "order:1")
	<-l.Done()
	out := buf.String()
	if !strings.Contains(out, "level=WARN") || !strings.Contains(out, "lease lost") || !strings.Contains(out, "key=order:1") {
		t.Fatalf("log output: got %q, want a WARN line about the lost lease of order:1", out)
	}
	if err := dlock.New(memlock.New(), dlock.WithLogger(nil)).Err(); !errors.Is(err, dlock.ErrInvalidOption) {
		t.Fatalf("WithLogger(nil): got %v, want ErrInvalidOption", err)
	}
}

func BenchmarkAcquireReleaseObserved(b *testing.B) {
	for _, bc := range []struct {
		name string
		opts []dlock.Option
	}{
		{"none", nil},
		{"observer", []dlock.Option{dlock.WithObserver(nopObserver{})}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			c := dlock.New(memlock.New(), bc.opts...)
			defer c.Close()
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				l, err := c.Acquire(ctx, "k")
				if err != nil {
					b.Fatal(err)
				}
				l.Release(ctx)
			}
		})
	}
}

type nopObserver struct{}

func (nopObserver) Observe(ctx context.Context, _ dlock.Event) context.Context { return ctx }
