package etcdlock_test

import (
	"testing"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/etcdlock"
)

func TestConformance(t *testing.T) {
	dlocktest.Run(t, dlocktest.Harness{
		NewBackend: func(t *testing.T) dlock.Backend { return etcdlock.New(newCli(t, srv.Endpoints())) },
		TTL:        ttl,
		Outage: func(t *testing.T) func() {
			t.Helper()
			if err := srv.Pause(); err != nil {
				t.Fatalf("pause etcd: %v", err)
			}
			return func() {
				if err := srv.Resume(); err != nil {
					t.Errorf("resume etcd: %v", err)
				}
			}
		},
		FIFO: true,
	})
}
