package gooselock_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/adapters/gooselock"
	"github.com/dlock-go/dlock/memlock"
)

// A goose Locker on dlock. Every migrator of the database creates it the
// same way, on a Client of the same lock server (memlock here; pglock,
// redislock, etcdlock... in production), and passes it to goose:
//
//	p, err := goose.NewProvider(goose.DialectPostgres, db, migrations, goose.WithLocker(locker))
//
// goose then calls Lock before migrating and Unlock after.
func Example() {
	locks := dlock.New(memlock.New(), dlock.WithTTL(30*time.Second))
	defer locks.Close()
	locker := gooselock.New(locks, "goose:app")

	ctx := context.Background()
	if err := locker.Lock(ctx, nil); err != nil {
		log.Fatal(err)
	}
	fmt.Println("migrating under fence", locker.Fence())
	if err := locker.Unlock(ctx, nil); err != nil {
		log.Fatal(err)
	}
	// Output: migrating under fence 1
}
