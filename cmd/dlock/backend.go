package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
)

// conn is an open backend: the dlock.Backend and what to close after the
// dlock.Client that uses it.
type conn struct {
	kind    string // the URL scheme: "redis", "redlock", "etcd", ...
	where   string // the servers, for messages
	backend dlock.Backend
	closers []func() error
}

// Close closes the clients the backend was built on (the dlock.Client
// closes the backend itself).
func (c *conn) Close() error {
	var errs []error
	for i := len(c.closers) - 1; i >= 0; i-- {
		if err := c.closers[i](); err != nil && !errors.Is(err, redis.ErrClosed) {
			errs = append(errs, err)
		}
	}
	c.closers = nil
	return errors.Join(errs...)
}

// errUnsupported is returned by backend factories that are not part of
// this build.
var errUnsupported = errors.New("not available in this build")

// unavailable wraps a failure to reach, hear from or use a server: exit
// code 2, like other bad input; the message names the server and, when the
// server answered with an error (a Redis error reply such as "ERR DB index
// is out of range"), says so rather than that it could not be reached.
func unavailable(kind, where string, timeout time.Duration, err error) error {
	if isServerReply(err) {
		return exitWith(exitUnavailable, fmt.Errorf("%s at %s answered with an error: %w", kind, where, err))
	}
	if errors.Is(err, context.DeadlineExceeded) || isTimeout(err) {
		return exitWith(exitUnavailable, fmt.Errorf("%s at %s did not answer within %v (--timeout): %w", kind, where, timeout, err))
	}
	return exitWith(exitUnavailable, fmt.Errorf("cannot reach %s at %s: %w", kind, where, err))
}

// isServerReply reports whether err is, or wraps, an error reply of a Redis
// server: the server was reached and refused the request.
func isServerReply(err error) bool {
	var re redis.Error
	return errors.As(err, &re)
}

// isTimeout reports whether err is a network timeout.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// openBackend connects to the servers of spec and checks, within timeout,
// that they answer. Connection and operation timeouts of the underlying
// clients are set to timeout as well. ttl is the longest lease the caller
// will take (ZooKeeper sessions are opened with it as their timeout).
func openBackend(ctx context.Context, spec *backendSpec, timeout, ttl time.Duration) (*conn, error) {
	c := &conn{kind: spec.scheme, where: strings.Join(spec.hosts, ",")}
	var err error
	switch spec.scheme {
	case "redis", "rediss", "redis+sentinel", "redis+cluster":
		var rdb redis.UniversalClient
		rdb, err = newRedisClient(spec, timeout)
		if err != nil {
			return nil, err
		}
		c.closers = append(c.closers, rdb.Close)
		if err = pingRedis(ctx, rdb, timeout); err != nil {
			err = unavailable(spec.scheme, c.where, timeout, err)
			break
		}
		c.backend, err = newRedisBackend(rdb)
	case "redlock":
		var nodes []*redis.Client
		for _, h := range spec.hosts {
			o := redisNodeOptions(spec, h, timeout)
			nodes = append(nodes, redis.NewClient(o))
			c.closers = append(c.closers, nodes[len(nodes)-1].Close)
		}
		if err = pingQuorum(ctx, nodes, timeout); err != nil {
			err = unavailable("redlock", c.where, timeout, err)
			break
		}
		nodeTimeout, _ := time.ParseDuration(spec.query.Get("node_timeout")) // validated by parseBackendURL
		c.backend, err = newRedlockBackend(nodes, nodeTimeout)
	case "etcd":
		var closeFn func() error
		c.backend, closeFn, err = newEtcdBackend(ctx, spec, timeout)
		if closeFn != nil {
			c.closers = append(c.closers, closeFn)
		}
	case "zk":
		var closeFn func() error
		c.backend, closeFn, err = newZKBackend(ctx, spec, timeout, ttl)
		if closeFn != nil {
			c.closers = append(c.closers, closeFn)
		}
	case "postgres":
		var closeFn func() error
		c.backend, closeFn, err = newPGBackend(ctx, spec, timeout)
		if closeFn != nil {
			c.closers = append(c.closers, closeFn)
		}
	default:
		err = usageErrorf("unknown backend scheme %q", spec.scheme)
	}
	if err != nil {
		_ = c.Close()
		if errors.Is(err, errUnsupported) {
			return nil, exitWith(exitFailure, fmt.Errorf("%s backend %w", spec.scheme, err))
		}
		var ee *exitError
		var ue *usageError
		if !errors.As(err, &ee) && !errors.As(err, &ue) {
			err = exitWith(exitFailure, err)
		}
		return nil, err
	}
	return c, nil
}

// newRedisClient builds the go-redis client for the redis, rediss,
// redis+sentinel and redis+cluster schemes. It does not connect.
func newRedisClient(spec *backendSpec, timeout time.Duration) (redis.UniversalClient, error) {
	switch spec.scheme {
	case "redis", "rediss":
		if len(spec.query) > 0 {
			return nil, usageErrorf("invalid backend URL %q: %s:// takes no query parameters", spec.redacted(), spec.scheme)
		}
		return redis.NewClient(redisNodeOptions(spec, spec.hosts[0], timeout)), nil
	case "redis+sentinel":
		for k := range spec.query {
			if k != "db" && k != "sentinel_user" && k != "sentinel_password" {
				return nil, usageErrorf("invalid backend URL %q: unknown query parameter %q (known: db, sentinel_user, sentinel_password)", spec.redacted(), k)
			}
		}
		o := redisOptions(spec, spec.hosts, timeout)
		o.MasterName = spec.path
		o.SentinelUsername, o.SentinelPassword = spec.query.Get("sentinel_user"), spec.query.Get("sentinel_password")
		o.DB, _ = dbNumber(spec.query.Get("db"))
		return redis.NewFailoverClient(o.Failover()), nil
	case "redis+cluster":
		if len(spec.query) > 0 {
			return nil, usageErrorf("invalid backend URL %q: redis+cluster:// takes no query parameters", spec.redacted())
		}
		return redis.NewClusterClient(redisOptions(spec, spec.hosts, timeout).Cluster()), nil
	}
	return nil, usageErrorf("%s:// is not a Redis scheme", spec.scheme)
}

// redisOptions returns the options every Redis client of spec shares:
// addrs, spec's credentials and timeout for dialling, reading and writing.
// ContextTimeoutEnabled makes the callers' deadlines bound socket I/O, so
// a frozen server costs at most the deadline.
func redisOptions(spec *backendSpec, addrs []string, timeout time.Duration) *redis.UniversalOptions {
	return &redis.UniversalOptions{
		Addrs:                 addrs,
		Username:              spec.user,
		Password:              spec.password,
		DialTimeout:           timeout,
		ReadTimeout:           timeout,
		WriteTimeout:          timeout,
		ContextTimeoutEnabled: true,
	}
}

// redisNodeOptions are the options of a client for one Redis server:
// redisOptions with spec's db, and TLS for rediss.
func redisNodeOptions(spec *backendSpec, addr string, timeout time.Duration) *redis.Options {
	u := redisOptions(spec, []string{addr}, timeout)
	u.DB, _ = dbNumber(spec.path)
	o := u.Simple()
	if spec.scheme == "rediss" {
		host, _, _ := net.SplitHostPort(addr)
		o.TLSConfig = &tls.Config{ServerName: host, MinVersion: tls.VersionTLS12}
	}
	return o
}

// pingRedis checks within timeout that the server(s) behind rdb answer.
func pingRedis(ctx context.Context, rdb redis.UniversalClient, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if cc, ok := rdb.(*redis.ClusterClient); ok {
		return cc.ForEachShard(ctx, func(ctx context.Context, c *redis.Client) error {
			return c.Ping(ctx).Err()
		})
	}
	return rdb.Ping(ctx).Err()
}

// pingQuorum checks within timeout that a majority of nodes answer.
func pingQuorum(ctx context.Context, nodes []*redis.Client, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	errs := make([]error, len(nodes))
	var wg sync.WaitGroup
	for i, n := range nodes {
		wg.Go(func() {
			if err := n.Ping(ctx).Err(); err != nil {
				errs[i] = &dlock.NodeError{Node: n.Options().Addr, Err: err}
			}
		})
	}
	wg.Wait()
	failed := 0
	for _, err := range errs {
		if err != nil {
			failed++
		}
	}
	if quorum := len(nodes)/2 + 1; len(nodes)-failed < quorum {
		return fmt.Errorf("%d of %d nodes are usable, a quorum needs %d: %w", len(nodes)-failed, len(nodes), quorum, errors.Join(errs...))
	}
	return nil
}
