package main

import (
	"context"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/etcdlock"
)

// etcdAvailable reports whether this build has the etcd backend.
const etcdAvailable = true

// newEtcdBackend connects to the etcd endpoints of spec, checks within
// timeout that the cluster answers, and returns the etcdlock backend and a
// function closing the etcd client. The URL's path, if any, is the key
// prefix ("etcd://h1,h2/jobs" uses "/jobs/"; default etcdlock.DefaultPrefix).
func newEtcdBackend(ctx context.Context, spec *backendSpec, timeout time.Duration) (dlock.Backend, func() error, error) {
	if len(spec.query) > 0 {
		return nil, nil, usageErrorf("invalid backend URL %q: etcd:// takes no query parameters", spec.redacted())
	}
	var opts []etcdlock.Option
	if spec.path != "" {
		opts = append(opts, etcdlock.WithPrefix("/"+strings.TrimSuffix(spec.path, "/")+"/"))
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   spec.hosts,
		Username:    spec.user,
		Password:    spec.password,
		DialTimeout: timeout,
		Logger:      zap.NewNop(),
		Context:     ctx,
		// gRPC's default reconnection backoff grows to 120 s: after a long
		// or repeated outage a client would stay away from a server that is
		// back. A lock holder or waiter wants to be back within a second.
		DialOptions: []grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
			MinConnectTimeout: time.Second,
		})},
	})
	if err != nil {
		return nil, nil, unavailable("etcd", strings.Join(spec.hosts, ","), timeout, err)
	}
	pctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if _, err := cli.Get(pctx, "dlock-ping", clientv3.WithCountOnly()); err != nil {
		_ = cli.Close()
		return nil, nil, unavailable("etcd", strings.Join(spec.hosts, ","), timeout, err)
	}
	b := etcdlock.New(cli, opts...)
	if err := b.Err(); err != nil {
		_ = cli.Close()
		return nil, nil, usageErrorf("invalid backend URL %q: %v", spec.redacted(), err)
	}
	return b, cli.Close, nil
}
