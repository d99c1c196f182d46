package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dlock-go/dlock"
)

// Part (c): a job runs four times as long as the lease's TTL. With the
// watchdog (the default) the lease is renewed every TTL/3 and a contender
// trying all along never gets the lock. Side by side, the same job with
// the watchdog turned off loses its lock after one TTL and the contender
// takes it while the job still runs.
const (
	wdTTL     = time.Second
	wdJob     = 4 * wdTTL
	wdAttempt = 100 * time.Millisecond // contender's retry interval
)

// renewCounter counts the watchdog's successful renewals.
type renewCounter struct{ n atomic.Int64 }

func (c *renewCounter) Observe(ctx context.Context, e dlock.Event) context.Context {
	if e.Kind == dlock.EventRenewed && e.Err == nil {
		c.n.Add(1)
	}
	return ctx
}

type wdRun struct {
	renewals  int64
	attempts  int           // contender's attempts while the job ran
	takenAt   time.Duration // when the contender first got the lock, 0 if never
	leaseErr  error         // the job's lease at the end
	releaseOK bool
	err       error
}

func partWatchdog(ctx context.Context, env *demoEnv, r *partResult) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	var with, without wdRun
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); with = watchdogRun(ctx, env, "demo:c:with-watchdog", true) }()
	go func() { defer wg.Done(); without = watchdogRun(ctx, env, "demo:c:without-watchdog", false) }()
	wg.Wait()
	if err := errors.Join(with.err, without.err); err != nil {
		r.fail("%v", err)
		r.Summary = "error: " + err.Error()
		return
	}
	r.detail("with the watchdog:    job held the lock %v under a %v TTL; %d renewals; a contender tried %d times and never got it; lease %s",
		wdJob, wdTTL, with.renewals, with.attempts, leaseState(with.leaseErr))
	if without.takenAt > 0 {
		r.detail("without the watchdog: the lease expired and the contender took the lock %v into the %v job; the job's lease reports: %s",
			without.takenAt.Round(10*time.Millisecond), wdJob, leaseState(without.leaseErr))
	} else {
		r.detail("without the watchdog: the contender never got the lock")
	}
	r.fact("renewals", with.renewals)
	r.fact("contender_attempts", with.attempts)
	r.fact("takeover_without_watchdog_ms", without.takenAt.Milliseconds())
	switch {
	case with.takenAt > 0:
		r.fail("the contender took the lock %v into the job although the watchdog ran", with.takenAt)
	case with.leaseErr != nil:
		r.fail("the watchdog lost the lease: %v", with.leaseErr)
	case !with.releaseOK:
		r.fail("the job's release failed")
	case with.renewals < int64(wdJob/wdTTL)*2:
		r.fail("only %d renewals in %v with TTL %v", with.renewals, wdJob, wdTTL)
	case without.takenAt == 0:
		r.fail("without the watchdog the lock was not taken over (it should expire after %v)", wdTTL)
	case !errors.Is(without.leaseErr, dlock.ErrLost):
		r.fail("without the watchdog the job's lease did not report the loss: %v", without.leaseErr)
	}
	r.Summary = fmt.Sprintf("%v job under a %v TTL: %d renewals, 0/%d takeovers; without watchdog taken over after %v",
		wdJob, wdTTL, with.renewals, with.attempts, without.takenAt.Round(10*time.Millisecond))
}

func leaseState(err error) string {
	if err == nil {
		return "intact"
	}
	return "lost (" + trim(err) + ")"
}

// watchdogRun holds key for wdJob while a contender on another connection
// tries to take it every wdAttempt.
func watchdogRun(ctx context.Context, env *demoEnv, key string, autoRenew bool) wdRun {
	var out wdRun
	jobRdb := env.redisNode(env.redis.Addr(), 2)
	defer jobRdb.Close()
	otherRdb := env.redisNode(env.redis.Addr(), 2)
	defer otherRdb.Close()
	jb, err1 := newRedisBackend(jobRdb)
	ob, err2 := newRedisBackend(otherRdb)
	if out.err = errors.Join(err1, err2); out.err != nil {
		return out
	}
	counter := &renewCounter{}
	job := dlock.New(jb, env.g.clientOptions(dlock.WithTTL(wdTTL), dlock.WithAutoRenew(autoRenew), dlock.WithObserver(counter))...)
	defer job.Close()
	other := dlock.New(ob, env.g.clientOptions(dlock.WithTTL(wdTTL))...)
	defer other.Close()

	lease, err := job.TryAcquire(ctx, key)
	if err != nil {
		out.err = err
		return out
	}
	start := time.Now()
	tick := time.NewTicker(wdAttempt)
	defer tick.Stop()
	for time.Since(start) < wdJob {
		select {
		case <-ctx.Done():
			out.err = ctx.Err()
			return out
		case <-tick.C:
		}
		out.attempts++
		l, err := other.TryAcquire(ctx, key)
		if err == nil {
			if out.takenAt == 0 {
				out.takenAt = time.Since(start)
			}
			_ = l.Release(ctx)
		} else if !errors.Is(err, dlock.ErrNotAcquired) {
			out.err = err
			return out
		}
	}
	out.leaseErr = lease.Err()
	out.renewals = counter.n.Load()
	out.releaseOK = lease.Release(ctx) == nil
	return out
}
