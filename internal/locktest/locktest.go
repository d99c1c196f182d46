// Package locktest is the test kit shared by dlock's own tests: unique
// keys, bounded contexts and condition waits, so that every package's
// tests use the same helpers instead of copies.
package locktest

import (
	"context"
	"crypto/rand"
	"strings"
	"testing"
	"time"
)

// Key returns a lock key unique to the test (its name and a random
// suffix).
func Key(t testing.TB) string {
	return strings.ReplaceAll(t.Name(), "/", ".") + "." + rand.Text()[:8]
}

// Ctx returns a context that ends after d or when the test ends.
func Ctx(t testing.TB, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// WaitFor polls cond every millisecond until it holds, failing the test
// with what if it does not within d.
func WaitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for: %s", d, what)
		}
		time.Sleep(time.Millisecond)
	}
}
