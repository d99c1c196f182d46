package etcdlock_test

import (
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/locktest"
)

// TestTryAcquireCoversExpires: a lock taken with TryAcquire shortly after
// a renewal of the lease it goes on (at most TTL/10 before the call, when
// a grant saves the keep-alive) lives on the server at least until its
// Expires. The Client counts a TryAcquire grant from the start of its
// call, whatever Grant.Since says, so the Backend must either renew the
// lease since the call began or grant the lock only for what is left of
// the lease from there (Grant.TTL). Checked on the Backend's shared lease
// (non-reentrant) and on its spare private lease (an owner's entry), as
// the conformance stress does: Inspect's TTL is an upper bound of the
// server's remaining lifetime, which must reach Expires. The TTL is long
// enough that the gap a grant counted from the earlier renewal would
// leave (over a second) is far above the rounding and round trips of the
// check. The lock still gets at least 9/10 of its TTL.
func TestTryAcquireCoversExpires(t *testing.T) {
	const long = 20 * time.Second // renewals reused for up to 2 s
	for _, tc := range []struct{ name, owner string }{{"shared", ""}, {"private", "expires-owner"}} {
		t.Run(tc.name, func(t *testing.T) {
			opts := []dlock.Option{dlock.WithTTL(long)}
			if tc.owner != "" {
				opts = append(opts, dlock.WithOwner(tc.owner))
			}
			c, b := newClient(t, srv.Endpoints(), opts...)
			ctx := locktest.Ctx(t, 30*time.Second)
			key := t.Name()

			// The first lock grants the lease (shared), or leaves its
			// private lease spare once released.
			first, err := c.TryAcquire(ctx, key+".first")
			if err != nil {
				t.Fatalf("TryAcquire: %v", err)
			}
			if tc.owner != "" {
				if err := first.Release(ctx); err != nil {
					t.Fatalf("Release: %v", err)
				}
			} else {
				defer first.Release(ctx)
			}
			// What is tested is time passing since the renewal, with
			// nothing to await: well inside the reuse window (long/10),
			// well outside the check's precision (a whole second).
			time.Sleep(1200 * time.Millisecond)

			start := time.Now()
			l, err := c.TryAcquire(ctx, key)
			if err != nil {
				t.Fatalf("TryAcquire: %v", err)
			}
			defer l.Release(ctx)
			before := time.Now()
			info, err := b.Inspect(ctx, key)
			after := time.Now()
			if err != nil {
				t.Fatalf("Inspect: %v", err)
			}
			if !info.Held || info.Fence != l.Fence() {
				t.Fatalf("Inspect: %+v, want held at fence %d", info, l.Fence())
			}
			exp := l.Expires()
			t.Logf("call %v, Expires %v after it; server TTL %v (upper bound) %v after the call",
				before.Sub(start).Round(time.Millisecond), exp.Sub(start).Round(time.Millisecond),
				info.TTL, after.Sub(start).Round(time.Millisecond))
			if info.TTL+after.Sub(before) < exp.Sub(before) {
				t.Fatalf("the server holds the lock for at most %v, Expires is in %v", info.TTL+after.Sub(before), exp.Sub(before))
			}
			if least := long * 9 / 10; exp.Sub(start) < least-least/100-2*time.Millisecond {
				t.Fatalf("Expires %v after the call's start, want at least 9/10 of the TTL %v", exp.Sub(start), long)
			}
		})
	}
}
