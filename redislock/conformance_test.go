package redislock_test

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/redislock"
)

// TestConformance runs the dlock conformance suite twice against a real
// redis-server: once with go-redis' default options and a paused server
// as the outage (the Backend bounds calls by ctx on helper goroutines),
// once with ContextTimeoutEnabled and a killed server restarted empty.
func TestConformance(t *testing.T) {
	t.Run("Pause", conformance(func(t *testing.T) redislock.Client {
		return newRDB(t, srv.Addr())
	}, outage(srv.Pause, srv.Resume)))
	t.Run("Kill", conformance(func(t *testing.T) redislock.Client {
		return newRDB(t, srv2.Addr(), func(o *redis.Options) { o.ContextTimeoutEnabled = true })
	}, outage(srv2.Kill, srv2.Restart)))
}

// conformance returns a test that runs the conformance suite (with FIFO,
// TTL 500ms) on Backends over the clients newRDB returns, with down as
// the harness's outage (nil: none).
func conformance(newRDB func(*testing.T) redislock.Client, down func(*testing.T) func()) func(*testing.T) {
	return func(t *testing.T) {
		dlocktest.Run(t, dlocktest.Harness{
			NewBackend: func(t *testing.T) dlock.Backend { return redislock.New(newRDB(t)) },
			TTL:        500 * time.Millisecond,
			FIFO:       true,
			Outage:     down,
		})
	}
}

// outage returns a harness outage that calls stop, and start when the
// outage ends.
func outage(stop, start func() error) func(*testing.T) func() {
	return func(t *testing.T) func() {
		if err := stop(); err != nil {
			t.Fatalf("start of the outage: %v", err)
		}
		return func() {
			if err := start(); err != nil {
				t.Fatalf("end of the outage: %v", err)
			}
		}
	}
}
