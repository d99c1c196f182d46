package main

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"

	"github.com/dlock-go/dlock/internal/fencedfloor"
)

// ---- the fenced floor on five nodes: the least a fenced Redlock can do ----

// fencedFloor5Subject is the fenced floor run as Redlock runs it: the
// acquire script on every node at once (a goroutine per node, as redsync
// does), granted when a majority grants; the release script on the nodes
// that granted. It does
// not agree on one fence across the nodes, check validity time or renew:
// it is the least work, not a lock to use.
func fencedFloor5Subject() *subject {
	return &subject{
		id:       "fenced-floor5",
		name:     "fenced floor (5 nodes): the fenced floor's scripts on a majority",
		role:     roleFloor,
		server:   srvRedis5,
		waitMode: "polls every 2 ms",
		open: func(e *env, o openOpts) (locker, error) {
			f := &fenced5Locker{}
			for _, a := range e.a.Redis5 {
				f.nodes = append(f.nodes, redisFloor{rdb: newRedisClient(a, o.count, o.pool), ttl: o.ttl, poll: o.poll})
			}
			return f, nil
		},
	}
}

// fenced5Locker holds one fenced floor per node.
type fenced5Locker struct{ nodes []redisFloor }

func (f *fenced5Locker) close() error {
	var errs []error
	for _, n := range f.nodes {
		errs = append(errs, n.close())
	}
	return errors.Join(errs...)
}

func (f *fenced5Locker) lock(ctx context.Context, key string) (held, error) {
	lk := "ffloor5:{" + key + "}"
	keys := []string{lk}
	token := rand.Text()
	ttl := f.nodes[0].ttl.Milliseconds()
	return poll(ctx, f.nodes[0].poll, func() (held, error) {
		h := &fenced5Held{f: f, keys: keys, token: token, fences: make([]int64, len(f.nodes))}
		errs := f.each(func(i int, rdb *redis.Client) (err error) {
			h.fences[i], err = fencedAcquire(ctx, rdb, keys, token, ttl)
			return err
		}, nil)
		granted, failed := 0, 0
		var first error
		for i, fence := range h.fences {
			if fence != 0 {
				granted++
			} else if errs[i] != nil {
				failed++
				first = cmp(first, errs[i])
			}
		}
		if granted > len(f.nodes)/2 {
			return h, nil
		}
		_ = h.unlock(ctx)
		if len(f.nodes)-failed <= len(f.nodes)/2 {
			return nil, first // no majority could have granted
		}
		return nil, nil
	})
}

// each runs call on every node whose index only admits (all when only is
// nil), each on its own goroutine, and returns their errors by index.
func (f *fenced5Locker) each(call func(i int, rdb *redis.Client) error, only func(i int) bool) []error {
	errs := make([]error, len(f.nodes))
	var wg sync.WaitGroup
	for i, n := range f.nodes {
		if only != nil && !only(i) {
			continue
		}
		wg.Go(func() { errs[i] = call(i, n.rdb) })
	}
	wg.Wait()
	return errs
}

// fenced5Held is a fenced floor taken on a majority: fences holds each
// node's grant (0 where it did not grant).
type fenced5Held struct {
	f      *fenced5Locker
	keys   []string
	token  string
	fences []int64
}

func (h *fenced5Held) unlock(ctx context.Context) error {
	errs := h.f.each(func(i int, rdb *redis.Client) error {
		return fencedfloor.Release.Run(ctx, rdb, h.keys, h.token, h.fences[i]).Err()
	}, func(i int) bool { return h.fences[i] != 0 })
	return errors.Join(errs...)
}

func (h *fenced5Held) lost() bool { return false }

// ---- the fenced floor over rueidis: its scripts, auto-pipelined ----

// fencedFloorRueidisSubject is the fenced floor's scripts sent with
// rueidis, which pipelines the commands of concurrent goroutines on one
// connection (as rueidislock does): the least a fenced lock does with the
// fastest client library here.
func fencedFloorRueidisSubject() *subject {
	return &subject{
		id:       "fenced-floor-rueidis",
		name:     "fenced floor over rueidis (auto-pipelined)",
		role:     roleFloor,
		server:   srvRedis,
		waitMode: "polls every 2 ms",
		open: func(e *env, o openOpts) (locker, error) {
			opt := rueidis.ClientOption{InitAddress: []string{e.a.Redis}, DisableCache: true}
			if o.count != nil {
				opt.DialCtxFn = countingDial(o.count)
			}
			c, err := rueidis.NewClient(opt)
			if err != nil {
				return nil, err
			}
			return &fencedRueidisLocker{c: c, ttl: strconv.FormatInt(o.ttl.Milliseconds(), 10), poll: o.poll}, nil
		},
	}
}

var (
	rueidisAcquire = rueidis.NewLuaScript(fencedfloor.AcquireSrc)
	rueidisRelease = rueidis.NewLuaScript(fencedfloor.ReleaseSrc)
)

type fencedRueidisLocker struct {
	c    rueidis.Client
	ttl  string
	poll time.Duration
}

func (f *fencedRueidisLocker) close() error {
	f.c.Close()
	return nil
}

func (f *fencedRueidisLocker) lock(ctx context.Context, key string) (held, error) {
	keys := []string{"ffloorr:{" + key + "}"}
	token := rand.Text()
	return poll(ctx, f.poll, func() (held, error) {
		v, err := rueidisAcquire.Exec(ctx, f.c, keys, []string{token, f.ttl}).AsIntSlice()
		if err != nil {
			return nil, err
		}
		if len(v) != 2 {
			return nil, fmt.Errorf("fenced floor: acquire returned %v", v)
		}
		if v[0] != 1 {
			return nil, nil
		}
		return &fencedRueidisHeld{f: f, keys: keys, token: token, fence: strconv.FormatInt(v[1], 10)}, nil
	})
}

type fencedRueidisHeld struct {
	f            *fencedRueidisLocker
	keys         []string
	token, fence string
}

func (h *fencedRueidisHeld) unlock(ctx context.Context) error {
	n, err := rueidisRelease.Exec(ctx, h.f.c, h.keys, []string{h.token, h.fence}).AsInt64()
	if err == nil && n != 1 {
		return errors.New("fenced floor: lock not held")
	}
	return err
}

func (h *fencedRueidisHeld) lost() bool { return false }
