package testserver

import (
	"net"
	"sync"
	"testing"
)

// TestBindRetry makes the first picked port of each server kind one that is
// already taken and checks that Start detects the failed bind and retries
// on a fresh port.
func TestBindRetry(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	busy := l.Addr().(*net.TCPAddr).Port

	var mu sync.Mutex
	handedBusy := false
	setHook := func(f func() int) {
		ports.mu.Lock()
		ports.hook = f
		ports.mu.Unlock()
	}
	arm := func() {
		mu.Lock()
		handedBusy = false
		mu.Unlock()
		setHook(func() int {
			mu.Lock()
			defer mu.Unlock()
			if handedBusy {
				return 0
			}
			handedBusy = true
			return busy
		})
	}
	defer setHook(nil)

	check := func(name string, err error, port func() int, stop func() error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		defer stop()
		mu.Lock()
		defer mu.Unlock()
		if !handedBusy {
			t.Fatalf("%s: busy port %d was never handed out", name, busy)
		}
		if port() == busy {
			t.Fatalf("%s: got the busy port %d, want a retry on another one", name, busy)
		}
	}

	arm()
	r, err := StartRedis(RedisOptions{})
	check("redis", err, func() int { return r.port }, r.Stop)

	arm()
	e, err := StartEtcd(EtcdOptions{})
	check("etcd (client port)", err, func() int { return e.clientPort }, e.Stop)

	arm()
	z, err := StartZooKeeper(ZooKeeperOptions{})
	check("zookeeper", err, func() int { return z.port }, z.Stop)
}
