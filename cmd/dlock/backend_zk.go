package main

import (
	"context"
	"strings"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/zklock"
)

// zkAvailable reports whether this build has the ZooKeeper backend.
const zkAvailable = true

// quietZKLogger discards go-zookeeper's connection log lines.
type quietZKLogger struct{}

func (quietZKLogger) Printf(string, ...any) {}

// newZKBackend opens a ZooKeeper session to the servers of spec with the
// session timeout session (a lease lives as long as its session, so the
// server must grant at least the lock's TTL), waits within timeout for
// the session, and returns the zklock backend; closing the backend closes
// the session. The URL's path, if any, is the znode under which locks live
// ("zk://h1,h2/jobs" uses "/jobs"; default zklock.DefaultPath).
func newZKBackend(ctx context.Context, spec *backendSpec, timeout, session time.Duration) (dlock.Backend, func() error, error) {
	if len(spec.query) > 0 {
		return nil, nil, usageErrorf("invalid backend URL %q: zk:// takes no query parameters", spec.redacted())
	}
	opts := []zklock.Option{zklock.WithLogger(quietZKLogger{})}
	if spec.path != "" {
		opts = append(opts, zklock.WithPath("/"+strings.TrimSuffix(spec.path, "/")))
	}
	conn, b, err := zklock.Connect(spec.hosts, session, opts...)
	if err != nil {
		return nil, nil, usageErrorf("invalid backend URL %q: %v", spec.redacted(), err)
	}
	// zk.Connect returns at once; wait for the session.
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for conn.State() != zk.StateHasSession {
		select {
		case <-ctx.Done():
			_ = b.Close()
			return nil, nil, ctx.Err()
		case <-deadline.C:
			_ = b.Close()
			return nil, nil, unavailable("zookeeper", strings.Join(spec.hosts, ","), timeout, context.DeadlineExceeded)
		case <-tick.C:
		}
	}
	return b, nil, nil
}
