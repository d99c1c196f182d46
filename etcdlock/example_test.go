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
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"127.0.0.1:2379"}, DialTimeout: 5 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	defer cli.Close()
	backend := etcdlock.New(cli)
	locks := dlock.New(backend, dlock.WithTTL(10*time.Second))
	defer locks.Close()

	ctx := context.Background()
	err = locks.Do(ctx, "order:1001", func(ctx context.Context, l *dlock.Lease) error {
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
