package gocronlock_test

import (
	"context"
	"crypto/rand"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/jonboulle/clockwork"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/adapters/gocronlock"
	"github.com/dlock-go/dlock/internal/locktest"
	"github.com/dlock-go/dlock/internal/locktest/adaptertest"
)

// offsetClock is the real clock shifted by d: a scheduler on it fires
// every tick d earlier than one on the real clock, like an instance whose
// clock runs ahead.
type offsetClock struct {
	clockwork.Clock
	d time.Duration
}

func (c offsetClock) Now() time.Time                  { return c.Clock.Now().Add(c.d) }
func (c offsetClock) Since(t time.Time) time.Duration { return c.Now().Sub(t) }
func (c offsetClock) Until(t time.Time) time.Duration { return t.Sub(c.Now()) }

// Three schedulers whose clocks are offset by up to 80ms run a job that
// ends well within the offsets every second: with a minimum hold, each
// tick runs exactly once.
func TestOncePerTick(t *testing.T) {
	for _, be := range adaptertest.Backends() {
		t.Run(be.Name, func(t *testing.T) {
			const ticks = 4
			job := "tick-" + rand.Text()[:8]
			var (
				mu   sync.Mutex
				runs = map[time.Time]int{} // tick → runs
				done = make(chan struct{})
			)
			for i, off := range []time.Duration{0, 40 * time.Millisecond, 80 * time.Millisecond} {
				clock := offsetClock{clockwork.NewRealClock(), off}
				c := be.Client(t, dlock.WithTTL(5*time.Second))
				s, err := gocron.NewScheduler(
					gocron.WithClock(clock),
					gocron.WithDistributedLocker(gocronlock.NewLocker(c, dlock.WithMinHold(600*time.Millisecond))))
				if err != nil {
					t.Fatal(err)
				}
				_, err = s.NewJob(gocron.CronJob("* * * * * *", true), gocron.NewTask(func() {
					// The tick this run belongs to, on this scheduler's clock.
					tick := clock.Now().Round(time.Second)
					mu.Lock()
					runs[tick]++
					if len(runs) == ticks+1 {
						close(done)
					}
					mu.Unlock()
				}), gocron.WithName(job))
				if err != nil {
					t.Fatal(err)
				}
				s.Start()
				t.Cleanup(func() {
					if err := s.Shutdown(); err != nil {
						t.Errorf("scheduler %d shutdown: %v", i, err)
					}
				})
			}
			select {
			case <-done:
			case <-time.After(30 * time.Second):
				t.Fatal("fewer than 5 ticks ran in 30s")
			}
			mu.Lock()
			defer mu.Unlock()
			var first time.Time
			for tick := range runs {
				if first.IsZero() || tick.Before(first) {
					first = tick
				}
			}
			for k := 0; k < ticks; k++ {
				tick := first.Add(time.Duration(k) * time.Second)
				if runs[tick] != 1 {
					t.Errorf("tick %s: got %d runs, want 1 (all: %v)", tick.Format("15:04:05"), runs[tick], runs)
				}
			}
		})
	}
}

// Lock fails while another instance holds the job's lock, and Unlock
// releases even with the done context gocron passes at shutdown.
func TestLockSkipsWhileHeld(t *testing.T) {
	for _, be := range adaptertest.Backends() {
		t.Run(be.Name, func(t *testing.T) {
			ctx := context.Background()
			job := "held-" + rand.Text()[:8]
			holder := be.Client(t, dlock.WithTTL(5*time.Second))
			l, err := gocronlock.NewLocker(holder).Lock(ctx, job)
			if err != nil {
				t.Fatal(err)
			}
			if l.(*gocronlock.Lock).Fence() == 0 {
				t.Fatal("Lock: fence 0, want the grant's fence")
			}
			c := be.Client(t, dlock.WithTTL(5*time.Second))
			if _, err := gocronlock.NewLocker(c).Lock(ctx, job); !errors.Is(err, dlock.ErrNotAcquired) {
				t.Fatalf("Lock of a held job: got %v, want ErrNotAcquired", err)
			}
			cctx, cancel := context.WithCancel(ctx)
			cancel() // gocron unlocks with the job's context, done at shutdown
			if err := l.Unlock(cctx); err != nil {
				t.Fatalf("Unlock with a done context: %v", err)
			}
			l2, err := gocronlock.NewLocker(c).Lock(ctx, job)
			if err != nil {
				t.Fatalf("Lock after Unlock: %v", err)
			}
			l2.Unlock(ctx)
		})
	}
}

// Two schedulers with an Elector: only the leader runs jobs; after it
// resigns the other leads with a larger fence.
func TestElector(t *testing.T) {
	for _, be := range adaptertest.Backends() {
		t.Run(be.Name, func(t *testing.T) {
			key := "leader-" + rand.Text()[:8]
			var (
				mu   sync.Mutex
				runs [2]int
			)
			electors := make([]*gocronlock.Elector, 2)
			scheds := make([]gocron.Scheduler, 2)
			for i := range electors {
				c := be.Client(t, dlock.WithTTL(2*time.Second))
				electors[i] = gocronlock.NewElector(c, key)
				if i == 0 {
					// The first instance leads before any job runs.
					if err := electors[0].IsLeader(context.Background()); err != nil {
						t.Fatal(err)
					}
				}
				s, err := gocron.NewScheduler(gocron.WithDistributedElector(electors[i]))
				if err != nil {
					t.Fatal(err)
				}
				_, err = s.NewJob(gocron.DurationJob(50*time.Millisecond), gocron.NewTask(func() {
					mu.Lock()
					runs[i]++
					mu.Unlock()
				}))
				if err != nil {
					t.Fatal(err)
				}
				s.Start()
				scheds[i] = s
				t.Cleanup(func() { s.Shutdown() })
			}
			count := func(i int) int { mu.Lock(); defer mu.Unlock(); return runs[i] }
			locktest.WaitFor(t, 30*time.Second, "5 runs by the leader", func() bool { return count(0) >= 5 })
			if n := count(1); n != 0 {
				t.Fatalf("follower ran %d times, want 0", n)
			}
			if err := electors[1].IsLeader(context.Background()); !errors.Is(err, gocronlock.ErrNotLeader) {
				t.Fatalf("follower IsLeader: got %v, want ErrNotLeader", err)
			}
			term := electors[0].Fence()
			if err := scheds[0].Shutdown(); err != nil {
				t.Fatal(err)
			}
			if err := electors[0].Resign(context.Background()); err != nil {
				t.Fatal(err)
			}
			locktest.WaitFor(t, 30*time.Second, "5 runs by the new leader", func() bool { return count(1) >= 5 })
			if f := electors[1].Fence(); f <= term {
				t.Fatalf("new leader's fence: got %d, want > %d", f, term)
			}
		})
	}
}
