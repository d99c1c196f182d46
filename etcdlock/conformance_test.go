package etcdlock_test

import (
	"testing"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/etcdlock"
	"github.com/dlock-go/dlock/internal/locktest"
)

func TestConformance(t *testing.T) {
	dlocktest.Run(t, dlocktest.Harness{
		NewBackend: func(t *testing.T) dlock.Backend { return etcdlock.New(newCli(t, srv.Endpoints())) },
		TTL:        ttl,
		Outage:     locktest.Outage("etcd", srv),
		FIFO:       true,
	})
}
