package main

import (
	"context"
	"errors"
	"net"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"
	"google.golang.org/grpc"
)

// newEtcdClient returns an etcd client whose connections count into c.
func newEtcdClient(endpoints []string, c *counter) (*clientv3.Client, error) {
	cfg := clientv3.Config{
		Endpoints:   endpoints,
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
	}
	if c != nil {
		cfg.DialOptions = []grpc.DialOption{grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			var d net.Dialer
			conn, err := d.DialContext(ctx, "tcp", addr)
			if err != nil {
				return nil, err
			}
			return c.wrap(conn), nil
		})}
	}
	return clientv3.New(cfg)
}

// etcdSeconds rounds a TTL up to whole seconds, at least 2 (etcd's minimum
// lease TTL with the default election timeout is 1.5 s).
func etcdSeconds(ttl time.Duration) int {
	s := int((ttl + time.Second - 1) / time.Second)
	return max(s, 2)
}

// openEtcdMutex opens a client of etcd's concurrency package with one
// session of the lease TTL (etcd's whole seconds).
func openEtcdMutex(e *env, o openOpts) (*etcdMutexLocker, error) {
	cli, err := newEtcdClient(e.a.Etcd, o.count)
	if err != nil {
		return nil, err
	}
	sess, err := concurrency.NewSession(cli, concurrency.WithTTL(etcdSeconds(o.ttl)))
	if err != nil {
		_ = cli.Close()
		return nil, err
	}
	return &etcdMutexLocker{cli: cli, sess: sess}, nil
}

// etcdKeys returns a subject's serverKeys: the number of keys under base
// followed by the run's prefix, counted on a client of its own.
func etcdKeys(base string) func(e *env, prefix string) (int, error) {
	return func(e *env, prefix string) (int, error) {
		cli, err := newEtcdClient(e.a.Etcd, nil)
		if err != nil {
			return 0, err
		}
		defer cli.Close()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		return etcdCount(ctx, cli, base+prefix)
	}
}

// etcdCount counts the keys under prefix.
func etcdCount(ctx context.Context, cli *clientv3.Client, prefix string) (int, error) {
	r, err := cli.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return 0, err
	}
	return int(r.Count), nil
}

// ---- etcd client/v3/concurrency ----

func etcdMutexSubject() *subject {
	return &subject{
		id:         "etcd-mutex",
		name:       "etcd concurrency.Mutex",
		role:       rolePeer,
		server:     srvEtcd,
		renews:     true,
		waitMode:   "queue by revision (watch)",
		serverKeys: etcdKeys("/bench/"),
		open: func(e *env, o openOpts) (locker, error) {
			l, err := openEtcdMutex(e, o)
			if err != nil {
				return nil, err // not a typed nil in the interface
			}
			return l, nil
		},
	}
}

// etcdMutexLocker holds one session (one lease, kept alive by the client)
// for all its mutexes, as concurrency.Mutex is meant to be used.
type etcdMutexLocker struct {
	cli  *clientv3.Client
	sess *concurrency.Session
}

func (l *etcdMutexLocker) lock(ctx context.Context, key string) (held, error) {
	m := concurrency.NewMutex(l.sess, "/bench/"+key)
	if err := m.Lock(ctx); err != nil {
		return nil, err
	}
	return etcdMutexHeld{m, etcdSession{l.sess}}, nil
}

func (l *etcdMutexLocker) close() error {
	return errors.Join(l.sess.Close(), l.cli.Close())
}

type etcdMutexHeld struct {
	m *concurrency.Mutex
	etcdSession
}

func (h etcdMutexHeld) unlock(ctx context.Context) error { return h.m.Unlock(ctx) }

// etcdSession is the lost method of a hold that lives as long as its
// session.
type etcdSession struct{ sess *concurrency.Session }

// lost reports whether the session has ended.
func (h etcdSession) lost() bool {
	select {
	case <-h.sess.Done():
		return true
	default:
		return false
	}
}
