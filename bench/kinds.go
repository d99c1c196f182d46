package main

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/dlock-go/dlock/internal/fencedfloor"
)

// K1–K3 measure what dlock offers beyond the mutex: a semaphore's permit
// against the raw sorted-set semaphore (K1), read holds of a read-write
// lock against the mutex on the same key (K2), and a leader election's
// fail-over after the leader's process is killed, against etcd's
// concurrency.Election (K3).

// semPermits is the number of permits of K1's semaphore.
const semPermits = 3

// k2Hold is how long K2's holders hold the key: a sleep, not S3's busy
// wait, so that 16 readers inside at once do not measure this machine's
// cores instead of the lock.
const k2Hold = time.Millisecond

// kindScenarios returns K1, K2 and K3.
func kindScenarios() []*scenario {
	return []*scenario{
		{
			id: "K1", title: "K1 — semaphore: acquire + release of one permit of 3",
			about: "One goroutine takes and releases a permit of a semaphore of 3 permits on one key in a loop " +
				"(S1's loop) for %s per run, %d runs; lease TTL %s. The floor is the classic Redis sorted-set " +
				"semaphore, without leases, renewal or fences: one EVALSHA of five `redis.call`s (TIME, " +
				"ZREMRANGEBYSCORE, ZCARD, ZADD, PEXPIRE) takes a permit, one ZREM gives it back. dlock: " +
				"`Client.Semaphore(key, 3)`, default options (each permit a renewed lease with a fence).",
			applies: kindApplies("K1"), runs: runsN, measure: measureK1,
			columns: cycleCols,
		},
		{
			id: "K2", title: "K2 — readers: 16 clients on one key, read holds against the mutex",
			about: "16 goroutines, each with its own client (as in S3), take one key in a loop and hold it " +
				"1 ms (a sleep: readers that busy-wait, as S3's holders do, would measure this machine's two cores " +
				"instead of the lock), for %s per run and mode, %d runs: once with read holds " +
				"(`RWLock.RLock`), once with the plain mutex (`Client.Acquire`) of the same kind of key, the " +
				"order alternating between runs. *× mutex* divides the read holds per second by the mutex's " +
				"acquisitions per second of the same run. *readers at once* is the most read holds held at the " +
				"same moment; *overlaps* counts mutex acquisitions that found another goroutine inside (must be 0).",
			applies: kindApplies("K2"), runs: runsN, measure: measureK2,
			columns: []column{
				{key: "read/s", head: "read holds/s"},
				{key: "mutex/s", head: "mutex acq/s"},
				{key: "x mutex", head: "× mutex", digits: 2},
				{key: "readers max", head: "readers at once", digits: 0},
				{key: "read srv/op", head: "server cmds/read", digits: 2, lowerBetter: true},
				overlapsCol,
			},
			maxOf: overlapsMax,
		},
		{
			id: "K3", title: "K3 — leader election: fail-over after the leader's SIGKILL (TTL 2 s)",
			about: "A separate process (this binary, re-executed) campaigns and leads the election on a key " +
				"with a TTL of %s; a second campaigner in the benchmark process starts campaigning; TTL/3 + 100 ms " +
				"later, just after a dlock leader's first renewal, the leader's process is SIGKILLed, so its " +
				"leadership has about TTL − 100 ms left (an etcd session keeps its lease alive every TTL/3 from its " +
				"own start, so its lease was refreshed up to TTL/3 before the kill). The figure is the time from the kill to the second " +
				"campaigner's leadership; %d repetitions. dlock: `Client.Election(key).Campaign`; etcd: " +
				"`concurrency.NewElection(session, prefix).Campaign` with a session of the same TTL. The bound " +
				"to meet on Redis is TTL + 100 ms.",
			applies: kindApplies("K3"),
			runs:    s4Reps, measure: measureK3,
			columns: recoveryCols, maxOf: recoveryMax,
			quickParallel: true,
		},
	}
}

// kindAbout fills in a K scenario's description with the run's sizes.
func kindAbout(sc *scenario, c config) string {
	switch sc.id {
	case "K1":
		return fmt.Sprintf(sc.about, c.s1Dur, c.runs, c.ttl)
	case "K2":
		return fmt.Sprintf(sc.about, c.s3Dur, c.runs)
	case "K3":
		return fmt.Sprintf(sc.about, c.s4TTL, c.s4Reps)
	}
	return sc.about
}

// kindApplies returns which subjects scenario id measures: dlock's
// backends on servers (not the in-process memlock, not the FIFO variants:
// nothing waits in K1, and K2 and K3 measure the default mode); in K1 the
// raw floor (as the sorted-set semaphore); in K3 etcd's election.
func kindApplies(id string) func(s *subject) string {
	return func(s *subject) string {
		switch {
		case id == "K1" && s.id == "floor":
			return ""
		case id == "K3" && s.id == "etcd-mutex":
			return ""
		case s.role != roleDlock:
			return "no semaphore, read-write lock or election in the library"
		case s.inProcess:
			return "in-process"
		case s.server == srvRedis5:
			return "not measured on Redlock"
		case s.id == "redislock-fifo":
			return "same as without FIFO here"
		}
		return ""
	}
}

// kindName returns the name a subject goes by in scenario id's table ("" for
// its own): etcd's Election is measured through the etcd-mutex subject.
func kindName(id string, s *subject) string {
	switch {
	case id == "K3" && s.id == "etcd-mutex":
		return "etcd concurrency.Election"
	case id == "K1" && s.id == "floor":
		return "floor: raw sorted-set semaphore"
	}
	return ""
}

// ---- openers ----

// openDlock opens subject s, which must be one of dlock's backends, as a
// dlock.Client.
func openDlock(e *env, s *subject, o openOpts) (*dlockLocker, error) {
	if s.role != roleDlock {
		return nil, unavailable("%s has no semaphores, read-write locks or elections", s.name)
	}
	l, err := s.open(e, o)
	if err != nil {
		return nil, err
	}
	d, ok := l.(*dlockLocker)
	if !ok {
		_ = l.close()
		return nil, unavailable("%s is not a dlock.Client", s.name)
	}
	return d, nil
}

// openSemaphore opens a locker whose lock takes one of permits permits of
// the key: the raw sorted-set semaphore for the floor, Client.Semaphore
// for dlock.
func openSemaphore(e *env, s *subject, o openOpts, permits int) (locker, error) {
	if s.id == "floor" {
		return &rawSemLocker{rdb: newRedisClient(e.a.Redis, o.count, o.pool), ttl: o.ttl, poll: o.poll, permits: permits}, nil
	}
	d, err := openDlock(e, s, o)
	if err != nil {
		return nil, err
	}
	return &semLocker{d: d, permits: permits}, nil
}

// openReader opens a locker whose lock takes a read hold (RWLock.RLock).
func openReader(e *env, s *subject, o openOpts) (locker, error) {
	d, err := openDlock(e, s, o)
	if err != nil {
		return nil, err
	}
	return readLocker{d}, nil
}

// semLocker takes permits of dlock semaphores.
type semLocker struct {
	d       *dlockLocker
	permits int
}

func (l *semLocker) lock(ctx context.Context, key string) (held, error) {
	lease, err := l.d.c.Semaphore(key, l.permits).Acquire(ctx, l.d.opts...)
	if err != nil {
		return nil, kindErr(err)
	}
	return dlockHeld{lease}, nil
}

func (l *semLocker) close() error { return l.d.close() }

// readLocker takes read holds of dlock read-write locks.
type readLocker struct{ d *dlockLocker }

func (l readLocker) lock(ctx context.Context, key string) (held, error) {
	lease, err := l.d.c.RWLock(key).RLock(ctx, l.d.opts...)
	if err != nil {
		return nil, kindErr(err)
	}
	return dlockHeld{lease}, nil
}

func (l readLocker) close() error { return l.d.close() }

// kindErr makes a backend's lack of the kind a reason not to measure.
func kindErr(err error) error {
	if errors.Is(err, errors.ErrUnsupported) {
		return unavailable("%v", err)
	}
	return err
}

// ---- the floor: the raw sorted-set semaphore ----

// rawSemLocker takes a permit with one EVALSHA of fencedfloor.RawSemaphore per
// attempt (2 ms between attempts) and gives it back with a ZREM. No
// renewal, no fence.
type rawSemLocker struct {
	rdb       *redis.Client
	ttl, poll time.Duration
	permits   int
}

func (r *rawSemLocker) lock(ctx context.Context, key string) (held, error) {
	key = "rawsem:" + key
	token := rand.Text()
	return poll(ctx, r.poll, func() (held, error) {
		n, err := fencedfloor.RawSemaphore.Run(ctx, r.rdb, []string{key}, token, r.permits, r.ttl.Milliseconds()).Int()
		if err != nil || n != 1 {
			return nil, err
		}
		return &rawSemHeld{r: r, key: key, token: token}, nil
	})
}

func (r *rawSemLocker) close() error { return r.rdb.Close() }

type rawSemHeld struct {
	r          *rawSemLocker
	key, token string
}

func (h *rawSemHeld) unlock(ctx context.Context) error {
	n, err := h.r.rdb.ZRem(ctx, h.key, h.token).Result()
	if err == nil && n != 1 {
		return errors.New("raw semaphore: permit not held")
	}
	return err
}

func (h *rawSemHeld) lost() bool { return false }

// ---- elections ----

// An elector is one campaigner of a library's leader election.
type elector interface {
	// campaign waits until this campaigner leads the election on key
	// (proclaiming value) or ctx ends; unlock of the result resigns.
	campaign(ctx context.Context, key, value string) (held, error)
	close() error
}

// openElector opens a campaigner of subject s: dlock's Election, or etcd's
// concurrency.Election for the etcd-mutex subject (one session with the
// lease TTL, as the mutex's).
func openElector(e *env, s *subject, o openOpts) (elector, error) {
	if s.id == "etcd-mutex" {
		l, err := openEtcdMutex(e, o)
		if err != nil {
			return nil, err // not a typed nil in the interface
		}
		return l, nil
	}
	d, err := openDlock(e, s, o)
	if err != nil {
		return nil, err
	}
	return dlockElector{d}, nil
}

// dlockElector campaigns with dlock.Election.
type dlockElector struct{ d *dlockLocker }

func (el dlockElector) campaign(ctx context.Context, key, value string) (held, error) {
	lease, err := el.d.c.Election(key).Campaign(ctx, value, el.d.opts...)
	if err != nil {
		return nil, kindErr(err)
	}
	return dlockHeld{lease}, nil
}

func (el dlockElector) close() error { return el.d.close() }

// campaign implements elector for etcd: concurrency.Election on the
// locker's session.
func (l *etcdMutexLocker) campaign(ctx context.Context, key, value string) (held, error) {
	el := concurrency.NewElection(l.sess, "/bench-elect/"+key)
	if err := el.Campaign(ctx, value); err != nil {
		return nil, err
	}
	return etcdElectionHeld{el, etcdSession{l.sess}}, nil
}

type etcdElectionHeld struct {
	el *concurrency.Election
	etcdSession
}

func (h etcdElectionHeld) unlock(ctx context.Context) error { return h.el.Resign(ctx) }

// ---- K1: semaphore ----

// measureK1: S1's loop on one permit of a semaphore of semPermits.
func measureK1(e *env, c config, s *subject, run int) (metrics, error) {
	open := func(e *env, o openOpts) (locker, error) { return openSemaphore(e, s, o, semPermits) }
	return measureLoop(e, c, s, run, "k1", c.s1Dur, open)
}

// ---- K2: readers against the mutex ----

// measureK2 runs the read holds and the mutex, one after the other (the
// order alternates between runs), each with 16 clients on one key.
func measureK2(e *env, c config, s *subject, run int) (metrics, error) {
	m := metrics{}
	modes := []bool{true, false}
	if run%2 == 0 {
		modes = []bool{false, true}
	}
	for _, read := range modes {
		open := s.open
		if read {
			open = func(e *env, o openOpts) (locker, error) { return openReader(e, s, o) }
		}
		r, err := contend(e, c, s, open, fmt.Sprintf("k2-%s-%d-%t", s.id, run, read))
		if err != nil {
			return nil, err
		}
		if read {
			m["read/s"], m["readers max"] = r.rate, float64(r.most)
			if r.cmds >= 0 {
				m["read srv/op"] = r.cmds
			}
		} else {
			m["mutex/s"], m["overlaps"] = r.rate, float64(r.overlaps)
		}
	}
	m["x mutex"] = m["read/s"] / m["mutex/s"]
	return m, nil
}

// contention is the outcome of one contend.
type contention struct {
	rate     float64 // acquisitions per second
	most     int64   // most holders inside at once
	overlaps int64   // acquisitions that found another holder inside
	cmds     float64 // Redis server commands per acquisition, -1 elsewhere
}

// contend runs c.s3Workers goroutines, each with its own locker from
// open, that take key in a loop and hold it k2Hold, for c.s3Dur.
func contend(e *env, c config, s *subject, open func(*env, openOpts) (locker, error), key string) (contention, error) {
	cnt := &counter{}
	lockers := make([]locker, 0, c.s3Workers)
	defer func() {
		for _, l := range lockers {
			_ = l.close()
		}
	}()
	for i := range c.s3Workers {
		l, err := open(e, openOpts{ttl: c.ttl, poll: c.poll, count: cnt})
		if err != nil {
			return contention{}, err
		}
		lockers = append(lockers, l)
		if err := cycle(l, fmt.Sprintf("%s-warm-%d", key, i)); err != nil {
			return contention{}, err
		}
	}
	if err := countStart(e, s, cnt); err != nil {
		return contention{}, err
	}
	var (
		stop            atomic.Bool
		inside, most    atomic.Int64
		total, overlaps atomic.Int64
		firstErr        atomic.Pointer[error]
		wg              sync.WaitGroup
		ctx, cancel     = context.WithCancel(context.Background())
		startc          = make(chan struct{})
	)
	defer cancel()
	for _, l := range lockers {
		wg.Go(func() {
			<-startc
			for !stop.Load() {
				h, err := l.lock(ctx, key)
				if err != nil {
					if !stop.Load() {
						firstErr.CompareAndSwap(nil, &err)
					}
					return
				}
				if !stop.Load() {
					n := inside.Add(1)
					if n > 1 {
						overlaps.Add(1)
					}
					for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
					}
					total.Add(1)
					time.Sleep(k2Hold)
					inside.Add(-1)
				}
				uctx, ucancel := opCtx()
				err = h.unlock(uctx)
				ucancel()
				if err != nil && !stop.Load() {
					firstErr.CompareAndSwap(nil, &err)
				}
			}
		})
	}
	start := time.Now()
	close(startc)
	time.Sleep(c.s3Dur)
	stop.Store(true)
	elapsed := time.Since(start)
	cmds, isRedis, cerr := e.serverCommands(s.server)
	n := total.Load()
	cancel()
	wg.Wait()
	if cerr != nil {
		return contention{}, cerr
	}
	if p := firstErr.Load(); p != nil {
		return contention{}, *p
	}
	if n == 0 {
		return contention{}, errors.New("no acquisition")
	}
	r := contention{rate: float64(n) / elapsed.Seconds(), most: most.Load(), overlaps: overlaps.Load(), cmds: -1}
	if isRedis {
		r.cmds = float64(cmds) / float64(n)
	}
	return r, nil
}

// ---- K3: election fail-over ----

// measureK3: S4 with an election: the holder process leads, the waiter
// campaigns.
func measureK3(e *env, c config, s *subject, run int) (metrics, error) {
	return measureTakeover(e, c, s, run, true)
}

// ---- targets ----

// kindTargets are the K scenarios' rows of the targets table.
func (r *report) kindTargets() []target {
	var ts []target
	if k1 := r.result("K1"); k1 != nil {
		ts = append(ts, versus(k1, "redislock", "floor", "K1: dlock redislock semaphore ≥ 0.8× the raw sorted-set semaphore (ops/s)", func(d, f *outcome) (string, bool) {
			v := d.value("ops/s") / f.value("ops/s")
			return fmt.Sprintf("%s vs %s ops/s = %.2f× (server commands per cycle %s vs %s)",
				num(d.value("ops/s"), 0), num(f.value("ops/s"), 0), v, num(d.value("srv/op"), 2), num(f.value("srv/op"), 2)), v >= 0.8
		}))
	}
	if k2 := r.result("K2"); k2 != nil {
		for _, o := range k2.outs {
			if o.med == nil {
				continue
			}
			ts = append(ts, target{fmt.Sprintf("K2 (for information, no target): %s, 16 readers against the mutex", o.s.name),
				fmt.Sprintf("%s read holds/s = %.2f× the mutex (%s acq/s), up to %s readers at once", num(o.value("read/s"), 0),
					o.value("x mutex"), num(o.value("mutex/s"), 0), num(o.value("readers max"), 0)), "—"})
		}
	}
	if k3 := r.result("K3"); k3 != nil {
		limit := float64((r.c.s4TTL + 100*time.Millisecond) / time.Millisecond)
		what := "K3: dlock redislock — a new leader within TTL + 100 ms of the leader's SIGKILL"
		d := k3.measured("redislock")
		if o := k3.find("redislock"); o != nil && len(o.errs) > 0 {
			ts = append(ts, target{what, fmt.Sprintf("%d of %d runs failed: %s", len(o.errs), len(o.errs)+len(o.runs), o.errs[0]), notMet})
		} else if d == nil {
			ts = append(ts, notMeasuredTarget(what, k3.why("redislock")))
		} else {
			mx := d.value("recovery max")
			ts = append(ts, target{what, fmt.Sprintf("median %s ms, max %s ms (limit %s ms)", num(d.value("recovery ms"), 0), num(mx, 0), num(limit, 0)), verdict(mx <= limit)})
		}
		if p := k3.measured("etcd-mutex"); d != nil && p != nil {
			ts = append(ts, target{"K3 (for information, no target): dlock redislock against etcd concurrency.Election (median fail-over)",
				fmt.Sprintf("%s ms against %s ms (dlock's leader was renewed about 100 ms before the kill, etcd's lease up to TTL/3 before)",
					num(d.value("recovery ms"), 0), num(p.value("recovery ms"), 0)), "—"})
		}
	}
	return ts
}
