package testserver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"
)

// RedisOptions configures [StartRedis] and [StartRedisN]. The zero value is a
// non-persistent server on a free loopback port.
type RedisOptions struct {
	// Persistence false (the default) disables RDB and AOF, so a server that
	// is killed and restarted comes back empty. True turns on
	// "appendonly yes" with "appendfsync always": every acknowledged write
	// survives Kill and Restart.
	Persistence bool

	// Port is the port to listen on at 127.0.0.1. 0 (the default) picks a
	// free port, retrying with another one if the server cannot bind it.
	Port int

	// Args are extra redis-server arguments, appended after the generated
	// ones so they override them, e.g. "--replicaof", "127.0.0.1", "6380".
	// Default none.
	Args []string

	// StartTimeout bounds the wait for the server to answer PING, at start
	// and at every Restart. 0 means DefaultStartTimeout (60 s).
	StartTimeout time.Duration
}

// Redis is a running redis-server 7 process listening on 127.0.0.1, with
// its own temporary directory (its working and data directory, which also
// holds redis.log). Besides the options, it always runs without RDB
// snapshots (save set to the empty string), with enable-debug-command local
// (DEBUG SLEEP and friends work over loopback) and with
// repl-diskless-sync-delay 0 (a replica's full sync starts at once instead
// of 5 s later).
//
// Restart waits until the server answers PING; for sentinels and cluster
// nodes it does not wait for the sentinel or cluster state to settle. After
// a Kill, a server with Persistence keeps its data, one without restarts
// empty.
//
// Its methods are safe for concurrent use.
type Redis struct {
	port    int
	busPort int // cluster bus port, 0 if not a cluster node
	lifecycle
}

// StartRedis starts one redis-server and returns once it answers PING. On
// failure it returns an error ending with the tail of the server log and
// leaves nothing running or on disk. It fails with an error matching
// [ErrNotInstalled] if redis-server is not in PATH.
func StartRedis(opts RedisOptions) (*Redis, error) {
	timeout, err := checkStart(opts.Port, opts.StartTimeout)
	if err != nil {
		return nil, err
	}
	return startRedis(redisSpec{
		kind:    "redis",
		port:    opts.Port,
		timeout: timeout,
		args: func(dir string, port, _ int) ([]string, error) {
			return append(redisBaseArgs(dir, port, opts.Persistence), opts.Args...), nil
		},
	})
}

// StartRedisN starts n independent redis-servers (no replication between
// them, as Redlock needs) concurrently, all with opts; opts.Port must be 0
// when n > 1. On error it stops the ones already started and returns nil.
func StartRedisN(n int, opts RedisOptions) ([]*Redis, error) {
	if n <= 0 {
		return nil, fmt.Errorf("testserver: StartRedisN: invalid n %d: must be positive", n)
	}
	if n > 1 && opts.Port != 0 {
		return nil, fmt.Errorf("testserver: StartRedisN: Port %d cannot be shared by %d servers; use 0", opts.Port, n)
	}
	nodes := make([]*Redis, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range nodes {
		wg.Go(func() {
			nodes[i], errs[i] = StartRedis(opts)
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		_ = StopAll(nodes...)
		return nil, err
	}
	return nodes, nil
}

// redisSpec describes one redis-server process to start.
type redisSpec struct {
	kind    string // "redis", "sentinel", "cluster" (temp dir and messages)
	port    int    // 0: pick
	busPort bool   // pick a cluster bus port as well
	timeout time.Duration
	// args returns the redis-server arguments for the chosen ports, writing
	// any file they need into dir.
	args func(dir string, port, busPort int) ([]string, error)
}

func startRedis(spec redisSpec) (*Redis, error) {
	bin, err := lookPath("redis-server", "redis-server")
	if err != nil {
		return nil, err
	}
	dir, err := serverDir(spec.kind, spec.port)
	if err != nil {
		return nil, err
	}
	r, err := retryBind(spec.port != 0, func() (*Redis, error) {
		return tryStartRedis(spec, bin, dir)
	})
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return r, nil
}

func tryStartRedis(spec redisSpec, bin, dir string) (*Redis, error) {
	port := spec.port
	var err error
	if port == 0 {
		if port, err = pickPort(); err != nil {
			return nil, err
		}
	}
	bus := 0
	if spec.busPort {
		if bus, err = pickPort(); err != nil {
			return nil, err
		}
	}
	args, err := spec.args(dir, port, bus)
	if err != nil {
		return nil, err
	}
	r := &Redis{port: port, busPort: bus}
	name := "redis-server"
	if spec.kind != "redis" {
		name += " (" + spec.kind + ")"
	}
	addr := r.Addr()
	r.srv = &server{
		name:    name + " " + addr,
		bin:     bin,
		args:    args,
		dir:     dir,
		logPath: filepath.Join(dir, "redis.log"),
		timeout: spec.timeout,
		ready:   func() error { return respPing(addr) },
		ports:   []int{port},
	}
	if bus != 0 {
		r.srv.ports = append(r.srv.ports, bus)
	}
	if err := r.srv.start(); err != nil {
		return nil, err
	}
	return r, nil
}

// redisBaseArgs are the arguments every non-sentinel node gets.
func redisBaseArgs(dir string, port int, persistence bool) []string {
	args := []string{
		"--port", strconv.Itoa(port),
		"--bind", "127.0.0.1",
		"--dir", dir,
		"--daemonize", "no",
		"--logfile", "", // stdout, which spawn appends to redis.log
		"--save", "",
		"--enable-debug-command", "local",
		// Full syncs start at once instead of waiting 5 s for more replicas.
		"--repl-diskless-sync-delay", "0",
	}
	if persistence {
		args = append(args, "--appendonly", "yes", "--appendfsync", "always")
	} else {
		args = append(args, "--appendonly", "no")
	}
	return args
}

// Addr returns the server's address, "127.0.0.1:PORT".
func (r *Redis) Addr() string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(r.port))
}

// Port returns the server's TCP port.
func (r *Redis) Port() int { return r.port }

// Stop sends SIGTERM, waits up to StopGrace (5 s), then sends SIGKILL, waits
// for the process to exit and removes Dir. A paused server is resumed so it
// can shut down. Stop is idempotent and safe on a nil *Redis; after Stop the
// server cannot be restarted.
func (r *Redis) Stop() error {
	if r == nil {
		return nil
	}
	return r.srv.stop(true)
}

// Do sends one command over a new connection and returns the reply: string
// for simple and bulk strings, int64 for integers, nil for null, []any for
// arrays; an error reply is returned as a [RedisError] error. ctx bounds the
// call; without a deadline it is bounded by 5 s.
func (r *Redis) Do(ctx context.Context, args ...string) (any, error) {
	return respDo(ctx, r.Addr(), args...)
}

// poll calls check every 100 ms until it returns nil or timeout passes, and
// then returns the last error.
func poll(timeout time.Duration, check func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := check()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// addrsOf returns the addresses of ns, in order.
func addrsOf[N interface{ Addr() string }](ns []N) []string {
	addrs := make([]string, len(ns))
	for i, n := range ns {
		addrs[i] = n.Addr()
	}
	return addrs
}
