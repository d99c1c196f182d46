package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"strings"
	"sync"
	"time"

	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/memlock"
)

// addrs are the servers' addresses: all a client needs, and what a crash
// holder process (S4) is handed in its environment.
type addrs struct {
	Redis  string   `json:"redis,omitempty"`
	Redis5 []string `json:"redis5,omitempty"`
	Etcd   []string `json:"etcd,omitempty"`
	ZK     string   `json:"zk,omitempty"`
}

// env starts the servers a run needs, once, on loopback, and stops them at
// the end. A holder process gets an env with addresses only.
type env struct {
	mu     sync.Mutex
	a      addrs
	redis  *testserver.Redis
	redis5 []*testserver.Redis
	etcd   *testserver.Etcd
	zk     *testserver.ZooKeeper
	mem    *memlock.Store // shared by every memlock client of a measurement
	logf   func(format string, args ...any)
}

func newEnv(logf func(string, ...any)) *env {
	return &env{mem: memlock.NewStore(), logf: logf}
}

func (e *env) startRedis() (*testserver.Redis, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.redis == nil && e.a.Redis == "" {
		r, err := testserver.StartRedis(testserver.RedisOptions{})
		if err != nil {
			return nil, err
		}
		e.redis, e.a.Redis = r, r.Addr()
		e.logf("started redis-server at %s", r.Addr())
	}
	return e.redis, nil
}

func (e *env) startRedis5() ([]*testserver.Redis, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.redis5 == nil && e.a.Redis5 == nil {
		rs, err := testserver.StartRedisN(5, testserver.RedisOptions{})
		if err != nil {
			return nil, err
		}
		e.redis5 = rs
		for _, r := range rs {
			e.a.Redis5 = append(e.a.Redis5, r.Addr())
		}
		e.logf("started 5 redis-servers at %s", strings.Join(e.a.Redis5, ", "))
	}
	return e.redis5, nil
}

func (e *env) startEtcd() (*testserver.Etcd, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.etcd == nil && e.a.Etcd == nil {
		s, err := testserver.StartEtcd(testserver.EtcdOptions{})
		if err != nil {
			return nil, err
		}
		e.etcd, e.a.Etcd = s, s.Endpoints()
		e.logf("started etcd at %s", strings.Join(e.a.Etcd, ", "))
	}
	return e.etcd, nil
}

func (e *env) startZK() (*testserver.ZooKeeper, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.zk == nil && e.a.ZK == "" {
		s, err := testserver.StartZooKeeper(testserver.ZooKeeperOptions{TickTime: 500 * time.Millisecond})
		if err != nil {
			return nil, err
		}
		e.zk, e.a.ZK = s, s.Addr()
		e.logf("started ZooKeeper at %s", s.Addr())
	}
	return e.zk, nil
}

// need starts the servers a subject needs.
func (e *env) need(s server) error {
	var err error
	switch s {
	case srvRedis:
		_, err = e.startRedis()
	case srvRedis5:
		_, err = e.startRedis5()
	case srvEtcd:
		_, err = e.startEtcd()
	case srvZK:
		_, err = e.startZK()
	}
	return err
}

// redisAddrs returns the addresses of the Redis servers behind s, for
// INFO commandstats.
func (e *env) redisAddrs(s server) []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	switch s {
	case srvRedis:
		if e.a.Redis != "" {
			return []string{e.a.Redis}
		}
	case srvRedis5:
		return e.a.Redis5
	}
	return nil
}

// reset empties the Redis servers of s and zeroes their statistics.
func (e *env) reset(s server) error {
	for _, a := range e.redisAddrs(s) {
		if err := flush(a); err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := resetStats(ctx, a)
		cancel()
		if err != nil {
			return err
		}
	}
	if s == srvMem {
		e.mem = memlock.NewStore()
	}
	return nil
}

// serverCommands sums the commands the Redis servers of s executed since
// the last reset; ok is false for servers that are not Redis.
func (e *env) serverCommands(s server) (n int64, ok bool, err error) {
	as := e.redisAddrs(s)
	for _, a := range as {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		c, err := commandStats(ctx, a)
		cancel()
		if err != nil {
			if s == srvRedis5 { // a stopped node (S6) has nothing to say
				continue
			}
			return 0, false, err
		}
		n += c
	}
	return n, len(as) > 0, nil
}

func (e *env) close() {
	e.mu.Lock()
	defer e.mu.Unlock()
	var errs []error
	if e.redis != nil {
		errs = append(errs, e.redis.Stop())
	}
	for _, r := range e.redis5 {
		errs = append(errs, r.Stop())
	}
	if e.etcd != nil {
		errs = append(errs, e.etcd.Stop())
	}
	if e.zk != nil {
		errs = append(errs, e.zk.Stop())
	}
	if err := errors.Join(errs...); err != nil {
		e.logf("stopping servers: %v", err)
	}
}

// versions describes the servers that ran.
func (e *env) versions() []string {
	var out []string
	if e.redis != nil || e.redis5 != nil {
		out = append(out, "Redis: "+firstLine(run("redis-server", "--version")))
	}
	if e.etcd != nil {
		out = append(out, "etcd: "+strings.Join(strings.Fields(strings.ReplaceAll(run("etcd", "--version"), "\n", "; ")), " "))
	}
	if e.zk != nil {
		out = append(out, "ZooKeeper: "+zkVersion(e.a.ZK))
	}
	return out
}

func run(name string, args ...string) string {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return fmt.Sprintf("unknown (%v)", err)
	}
	return strings.TrimSpace(string(out))
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}

// zkVersion asks a ZooKeeper server with the four-letter word srvr.
func zkVersion(addr string) string {
	conn, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return "unknown"
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := conn.Write([]byte("srvr")); err != nil {
		return "unknown"
	}
	sc := bufio.NewScanner(conn)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "Zookeeper version: "); ok {
			return v
		}
	}
	return "unknown"
}
