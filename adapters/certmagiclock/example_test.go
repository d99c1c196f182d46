package certmagiclock_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/caddyserver/certmagic"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/adapters/certmagiclock"
	"github.com/dlock-go/dlock/memlock"
)

// Certificate storage whose locks are dlock locks. Every instance wraps
// its storage the same way, on a Client of the same lock server (memlock
// here; redislock, pglock, etcdlock... in production), and hands it to
// certmagic as Config.Storage.
func Example() {
	dir, err := os.MkdirTemp("", "certs-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	locks := dlock.New(memlock.New(), dlock.WithTTL(30*time.Second))
	defer locks.Close()
	storage := certmagiclock.Wrap(&certmagic.FileStorage{Path: dir}, certmagiclock.New(locks))

	// What certmagic does around obtaining a certificate:
	ctx := context.Background()
	if err := storage.Lock(ctx, "issue_cert_example.com"); err != nil {
		log.Fatal(err)
	}
	fmt.Println("fence issued:", storage.Locker().Fence("issue_cert_example.com") > 0)
	if err := storage.Unlock(ctx, "issue_cert_example.com"); err != nil {
		log.Fatal(err)
	}
	// Output: fence issued: true
}
