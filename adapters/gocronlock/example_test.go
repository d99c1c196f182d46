package gocronlock_test

import (
	"fmt"
	"log"
	"time"

	"github.com/go-co-op/gocron/v2"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/adapters/gocronlock"
	"github.com/dlock-go/dlock/memlock"
)

// A scheduler whose jobs run on one instance per tick. Every instance
// creates its scheduler the same way, on a Client of the same lock server
// (memlock here; redislock, pglock, etcdlock... in production). The
// minimum hold keeps a fast job's lock taken until instances whose ticks
// lag have passed the tick.
func Example() {
	locks := dlock.New(memlock.New(), dlock.WithTTL(30*time.Second))
	defer locks.Close()
	s, err := gocron.NewScheduler(gocron.WithDistributedLocker(
		gocronlock.NewLocker(locks, dlock.WithMinHold(time.Second))))
	if err != nil {
		log.Fatal(err)
	}
	ran := make(chan struct{})
	_, err = s.NewJob(gocron.OneTimeJob(gocron.OneTimeJobStartImmediately()),
		gocron.NewTask(func() { close(ran) }), gocron.WithName("report"))
	if err != nil {
		log.Fatal(err)
	}
	s.Start()
	<-ran
	if err := s.Shutdown(); err != nil {
		log.Fatal(err)
	}
	fmt.Println("ran once")
	// Output: ran once
}
