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
	t.Run("Pause", func(t *testing.T) {
		dlocktest.Run(t, dlocktest.Harness{
			NewBackend: func(t *testing.T) dlock.Backend {
				return redislock.New(newRDB(t, srv.Addr()))
			},
			TTL:  500 * time.Millisecond,
			FIFO: true,
			Outage: func(t *testing.T) func() {
				if err := srv.Pause(); err != nil {
					t.Fatalf("Pause: %v", err)
				}
				return func() {
					if err := srv.Resume(); err != nil {
						t.Fatalf("Resume: %v", err)
					}
				}
			},
		})
	})
	t.Run("Kill", func(t *testing.T) {
		dlocktest.Run(t, dlocktest.Harness{
			NewBackend: func(t *testing.T) dlock.Backend {
				return redislock.New(newRDB(t, srv2.Addr(), func(o *redis.Options) {
					o.ContextTimeoutEnabled = true
				}))
			},
			TTL:  500 * time.Millisecond,
			FIFO: true,
			Outage: func(t *testing.T) func() {
				if err := srv2.Kill(); err != nil {
					t.Fatalf("Kill: %v", err)
				}
				return func() {
					if err := srv2.Restart(); err != nil {
						t.Fatalf("Restart: %v", err)
					}
				}
			},
		})
	})
}
