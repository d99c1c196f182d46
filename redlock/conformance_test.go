package redlock_test

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/redlock"
)

// nodeTimeout is the per-node timeout of most tests: on this shared
// 2-core test machine (load average 5–10) a redis-server is at times not
// scheduled for 100 ms, so the 50ms default would fail healthy calls.
const nodeTimeout = 200 * time.Millisecond

// TestConformance runs the dlock conformance suite against five real
// redis-servers, twice: the outage pauses three of them (a majority stops
// answering but keeps its data), or kills three and restarts them empty.
// The second run uses go-redis' ContextTimeoutEnabled, so node calls are
// bounded by go-redis itself rather than by redislock's helper goroutines.
func TestConformance(t *testing.T) {
	for _, f := range []fault{pause, kill} {
		t.Run(string(f), func(t *testing.T) {
			dlocktest.Run(t, dlocktest.Harness{
				NewBackend: func(t *testing.T) dlock.Backend {
					rdbs := newClients(t, func(o *redis.Options) {
						o.ContextTimeoutEnabled = f == kill
					})
					return closing{redlock.NewWithOptions(rdbs, redlock.WithNodeTimeout(nodeTimeout)), rdbs}
				},
				TTL: 500 * time.Millisecond,
				Outage: func(t *testing.T) func() {
					return f.apply(t, 0, 2, 4)
				},
			})
		})
	}
}

// closing is a Backend that closes its node clients with it: a long
// stress run creates and closes hundreds of Clients, and their
// connections would otherwise stay open until the test ends.
type closing struct {
	*redlock.Backend
	rdbs []*redis.Client
}

func (c closing) Close() error {
	err := c.Backend.Close()
	for _, rdb := range c.rdbs {
		rdb.Close()
	}
	return err
}
