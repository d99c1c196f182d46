package etcdlock_test

import (
	"context"
	"fmt"
	"log"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/etcdlock"
)

// At most 3 holders call the payment provider at once, across every
// process; a permit whose holder dies returns within its TTL. (Not run:
// it needs an etcd server on 127.0.0.1:2379.)
func Example_semaphore() {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"127.0.0.1:2379"}, DialTimeout: 5 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	defer cli.Close()
	locks := dlock.New(etcdlock.New(cli), dlock.WithTTL(10*time.Second))
	defer locks.Close()

	ctx := context.Background()
	permit, err := locks.Semaphore("payments", 3).Acquire(ctx)
	if err != nil {
		log.Fatal(err) // errors.Is(err, dlock.ErrPermits): another holder says other than 3
	}
	defer permit.Release(context.WithoutCancel(ctx))
	work, cancel := permit.Context(ctx) // cancelled if the permit is lost
	defer cancel()
	_ = work // call the provider with work
}

// One instance runs the scheduler; the others wait to take over and can
// tell who leads. (Not run: it needs an etcd server on 127.0.0.1:2379.)
func Example_election() {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"127.0.0.1:2379"}, DialTimeout: 5 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	defer cli.Close()
	locks := dlock.New(etcdlock.New(cli), dlock.WithTTL(10*time.Second))
	defer locks.Close()

	ctx := context.Background()
	e := locks.Election("scheduler")
	go func() {
		for l := range e.Observe(ctx) {
			fmt.Printf("leader %q, term %d\n", l.Value, l.Term)
		}
	}()
	lead, err := e.Campaign(ctx, "host-a:8080") // waits until elected
	if err != nil {
		log.Fatal(err)
	}
	defer e.Resign(context.WithoutCancel(ctx))
	// Stamp writes with lead.Fence(), the term: a store that keeps the
	// highest term seen rejects a deposed leader's writes.
	<-lead.Done() // the leadership was lost (lead.Err() says why)
}
