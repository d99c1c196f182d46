package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/internal/resp"
	"github.com/dlock-go/dlock/internal/scale"
)

// counter counts the requests a client sends. A request is a burst of
// bytes the client writes on one connection after it last read something
// there: one command, one pipeline (however many socket writes its buffer
// needs) or one pub/sub SUBSCRIBE. Bytes the server pushes (a published
// message, a keyspace invalidation) are reads and never count. Counting on
// the connection covers what go-redis' command hooks miss (its pub/sub
// connection bypasses them) and works the same for every client library:
// the go-redis Dialer, rueidis' DialCtxFn, gRPC's context dialer and
// go-zookeeper's dialer all wrap their connections with it. (The go-redis
// Dialer rather than a DialHook: dlock's redislock dials a connection of
// its own with the client's Dialer, which hooks do not see.)
type counter struct {
	requests atomic.Int64 // request bursts, all connections
	commands atomic.Int64 // go-redis commands through the Process hooks (cross-check)
}

func (c *counter) wrap(conn net.Conn) net.Conn {
	if c == nil {
		return conn
	}
	return scale.CountRequests(conn, &c.requests)
}

// redisHook counts the commands of go-redis' pool into a counter, through
// the Process hooks.
type redisHook struct{ c *counter }

func (h redisHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h redisHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.c.commands.Add(1)
		return next(ctx, cmd)
	}
}

func (h redisHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.c.commands.Add(int64(len(cmds)))
		return next(ctx, cmds)
	}
}

// newRedisClient returns a go-redis client for addr with the options every
// Redis subject shares: go-redis defaults plus ContextTimeoutEnabled (the
// caller's context deadline bounds socket I/O), and a counting dialer and
// hook when c is not nil. poolSize 0 keeps the go-redis default (10 per
// CPU).
func newRedisClient(addr string, c *counter, poolSize int) *redis.Client {
	o := &redis.Options{
		Addr:                  addr,
		ContextTimeoutEnabled: true,
		PoolSize:              poolSize,
	}
	if c != nil {
		d := &net.Dialer{Timeout: 5 * time.Second, KeepAlive: 5 * time.Minute} // go-redis' own
		o.Dialer = func(ctx context.Context, network, addr string) (net.Conn, error) {
			conn, err := d.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return c.wrap(conn), nil
		}
	}
	rdb := redis.NewClient(o)
	if c != nil {
		rdb.AddHook(redisHook{c})
	}
	return rdb
}

// countingDial returns a dial function (for rueidis' DialCtxFn) that
// counts on the connections it makes.
func countingDial(c *counter) func(context.Context, string, *net.Dialer, *tls.Config) (net.Conn, error) {
	return func(ctx context.Context, addr string, d *net.Dialer, _ *tls.Config) (net.Conn, error) {
		conn, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return nil, err
		}
		return c.wrap(conn), nil
	}
}

// commandStats reads the number of commands the Redis server at addr
// executed since the last CONFIG RESETSTAT, leaving out INFO and CONFIG
// (the benchmark's own bookkeeping). It speaks RESP on a plain connection,
// so it adds no HELLO or CLIENT command of its own.
func commandStats(ctx context.Context, addr string) (int64, error) {
	v, err := respCall(ctx, addr, "INFO", "commandstats")
	if err != nil {
		return 0, err
	}
	var total int64
	for _, line := range strings.Split(v, "\n") {
		line = strings.TrimSpace(line)
		name, rest, ok := strings.Cut(line, ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		cmd := strings.TrimPrefix(name, "cmdstat_")
		if strings.HasPrefix(cmd, "info") || strings.HasPrefix(cmd, "config") {
			continue
		}
		for _, kv := range strings.Split(rest, ",") {
			if n, ok := strings.CutPrefix(kv, "calls="); ok {
				c, err := strconv.ParseInt(n, 10, 64)
				if err != nil {
					return 0, fmt.Errorf("INFO commandstats: %q: %w", line, err)
				}
				total += c
			}
		}
	}
	return total, nil
}

// resetStats zeroes a Redis server's command statistics.
func resetStats(ctx context.Context, addr string) error {
	_, err := respCall(ctx, addr, "CONFIG", "RESETSTAT")
	return err
}

// flush empties a Redis server between measurements.
func flush(addr string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := respCall(ctx, addr, "FLUSHALL")
	return err
}

// respCall sends one command on a new connection and returns a simple or
// bulk string reply.
func respCall(ctx context.Context, addr string, args ...string) (string, error) {
	v, err := resp.Do(ctx, addr, time.Minute, args...)
	if err != nil {
		return "", fmt.Errorf("redis %s: %w", args[0], err)
	}
	str, ok := v.(string)
	if !ok {
		return "", fmt.Errorf("redis %s: unexpected reply %v", args[0], v)
	}
	return str, nil
}
