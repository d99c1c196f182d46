package main

import (
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/redlock"
)

// redlockAvailable reports whether this build has the redlock backend.
const redlockAvailable = true

// newRedlockBackend returns the Redlock backend over the independent Redis
// nodes (closed by the caller). nodeTimeout, when not zero, is how long
// each node gets to answer one call (URL query node_timeout); the default
// is redlock's, min(TTL/10, 50ms).
func newRedlockBackend(nodes []*redis.Client, nodeTimeout time.Duration) (dlock.Backend, error) {
	var opts []redlock.Option
	if nodeTimeout > 0 {
		opts = append(opts, redlock.WithNodeTimeout(nodeTimeout))
	}
	b := redlock.NewWithOptions(nodes, opts...)
	if err := b.Err(); err != nil {
		return nil, err
	}
	return b, nil
}
