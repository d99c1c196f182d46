package dlock

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"time"
)

// A WaitStrategy decides how long Acquire waits between attempts while the
// lock is held by someone else, and when it gives up. Strategies are
// stateless values: the attempt number is passed in, so one value can be
// shared by any number of goroutines and calls.
//
// Delay is called after failed attempt number attempt (1 for the first
// failure) and returns the longest time to wait before the next attempt,
// or ok == false to give up. With a backend that notifies releases (all
// dlock backends do), a release ends the wait early and the wait is also
// bounded by the holder's remaining TTL, so the delay is a ceiling, not a
// polling interval. With a backend that queues waiters server-side
// (and for every WithFIFO wait) the strategy only sets the
// patience: the sum of its delays bounds the time spent in the queue.
type WaitStrategy interface {
	Delay(attempt int) (d time.Duration, ok bool)
}

// NoWait gives up after the first failed attempt: Acquire behaves like
// TryAcquire.
func NoWait() WaitStrategy { return noWait{} }

type noWait struct{}

func (noWait) Delay(int) (time.Duration, bool) { return 0, false }

// Constant waits at most d between attempts, forever (until the caller's
// context ends). A d ≤ 0 is reported by New as ErrInvalidOption.
func Constant(d time.Duration) WaitStrategy { return constant{d} }

type constant struct{ d time.Duration }

func (c constant) Delay(int) (time.Duration, bool) { return c.d, true }

func (c constant) validate() error {
	if c.d <= 0 {
		return fmt.Errorf("Constant(%v): the delay must be positive", c.d)
	}
	return nil
}

// Exponential waits a random time in [0, min(max, base·2^(attempt-1))]
// ("full jitter") between attempts, forever (until the caller's context
// ends). It needs 0 < base ≤ max (max may be math.MaxInt64: no cap);
// other values are reported by New as ErrInvalidOption. The default
// strategy is Exponential(10ms, 1s).
func Exponential(base, max time.Duration) WaitStrategy { return exponential{base, max} }

type exponential struct{ base, max time.Duration }

func (e exponential) Delay(attempt int) (time.Duration, bool) {
	return jitter(e.ceiling(attempt)), true
}

func (e exponential) ceiling(attempt int) time.Duration {
	d := e.base
	for i := 1; i < attempt && d < e.max; i++ {
		if d > e.max/2 {
			return e.max // doubling would pass max (or overflow)
		}
		d *= 2
	}
	return min(d, e.max)
}

func (e exponential) validate() error {
	switch {
	case e.base <= 0:
		return fmt.Errorf("Exponential(%v, %v): the base must be positive", e.base, e.max)
	case e.max < e.base:
		return fmt.Errorf("Exponential(%v, %v): the maximum must be at least the base", e.base, e.max)
	}
	return nil
}

// jitter returns a uniformly random duration in [1ns, d] (d when d ≤ 1).
func jitter(d time.Duration) time.Duration {
	if d <= 1 {
		return d
	}
	return 1 + rand.N(d)
}

// Limit makes at most attempts attempts in total, waiting as s says in
// between; Limit(1, s) is NoWait. It needs attempts ≥ 1 and a valid s;
// other values are reported by New as ErrInvalidOption.
func Limit(attempts int, s WaitStrategy) WaitStrategy { return limit{attempts, s} }

type limit struct {
	n int
	s WaitStrategy
}

func (l limit) Delay(attempt int) (time.Duration, bool) {
	if attempt >= l.n {
		return 0, false
	}
	return l.s.Delay(attempt)
}

func (l limit) validate() error {
	if l.n < 1 {
		return fmt.Errorf("Limit(%d, …): at least 1 attempt", l.n)
	}
	if err := checkStrategy(l.s); err != nil {
		return fmt.Errorf("Limit(%d, …): %w", l.n, err)
	}
	return nil
}

// checkStrategy returns an error naming what makes s unusable, or nil.
// Strategies from outside the package are trusted to be valid.
func checkStrategy(s WaitStrategy) error {
	if s == nil {
		return errors.New("nil strategy")
	}
	if v, ok := s.(interface{ validate() error }); ok {
		return v.validate()
	}
	return nil
}

// patience is the most a strategy will wait in total, used as the bound
// of a server-side queue wait; ok is false when the strategy waits
// forever (or longer than 65,536 attempts, or 1,024 for strategies from
// outside this package).
func patience(s WaitStrategy) (total time.Duration, ok bool) {
	switch v := s.(type) {
	case noWait:
		return 0, true
	case constant, exponential:
		return 0, false
	case limit:
		if v.n > 1<<16 {
			return 0, false
		}
		for attempt := 1; attempt < v.n; attempt++ {
			d, more := maxDelay(v.s, attempt)
			if !more {
				break
			}
			if total > math.MaxInt64-max(d, 0) {
				return 0, false // longer than a Duration holds: forever
			}
			total += max(d, 0)
		}
		return total, true
	}
	for attempt := 1; attempt <= 1<<10; attempt++ {
		d, more := s.Delay(attempt)
		if !more {
			return total, true
		}
		if total > math.MaxInt64-max(d, 0) {
			return 0, false
		}
		total += max(d, 0)
	}
	return 0, false
}

// maxDelay is Delay without jitter: the ceiling the strategy may wait.
func maxDelay(s WaitStrategy, attempt int) (time.Duration, bool) {
	switch v := s.(type) {
	case exponential:
		return v.ceiling(attempt), true
	case limit:
		if attempt >= v.n {
			return 0, false
		}
		return maxDelay(v.s, attempt)
	}
	return s.Delay(attempt)
}
