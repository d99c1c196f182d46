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

// A lock on etcd, and a write to etcd that is applied only while the lock
// is still held. (Not run: it needs an etcd server on 127.0.0.1:2379.)
func Example() {
	cli := connect()
	defer cli.Close()
	backend := etcdlock.New(cli)
	locks := dlock.New(backend, dlock.WithTTL(10*time.Second))
	defer locks.Close()

	ctx := context.Background()
	err := locks.Do(ctx, "order:1001", func(ctx context.Context, l *dlock.Lease) error {
		resp, err := cli.Txn(ctx).
			If(backend.Guard(l)). // still the holder, whatever the clocks say
			Then(clientv3.OpPut("/orders/1001/state", "paid")).
			Commit()
		if err != nil {
			return err
		}
		if !resp.Succeeded {
			return fmt.Errorf("lock lost before the write: %w", dlock.ErrLost)
		}
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
}

// At most 3 holders call the payment provider at once, across every
// process; a permit whose holder dies returns within its TTL. (Not run:
// it needs an etcd server on 127.0.0.1:2379.)
func Example_semaphore() {
	cli := connect()
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
	cli := connect()
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

// connect returns a client of the etcd server on 127.0.0.1:2379.
func connect() *clientv3.Client {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"127.0.0.1:2379"}, DialTimeout: 5 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	return cli
}
