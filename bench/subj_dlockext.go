package main

import (
	"net"
	"time"

	"github.com/dlock-go/dlock/etcdlock"
	"github.com/dlock-go/dlock/zklock"
)

// dlock's etcd and ZooKeeper backends live in their own modules
// (github.com/dlock-go/dlock/etcdlock, .../zklock), required and replaced
// in go.mod like the core module.

func etcdlockSubject() *subject {
	return &subject{
		id:         "etcdlock",
		name:       "dlock etcdlock",
		role:       roleDlock,
		server:     srvEtcd,
		renews:     true,
		waitMode:   "server-side queue",
		serverKeys: etcdKeys(etcdlock.DefaultPrefix),
		open: func(e *env, o openOpts) (locker, error) {
			cli, err := newEtcdClient(e.a.Etcd, o.count)
			if err != nil {
				return nil, err
			}
			return newDlockLocker(etcdlock.New(cli), o, nil, cli.Close)
		},
	}
}

func zklockSubject() *subject {
	return &subject{
		id:       "zklock",
		name:     "dlock zklock",
		role:     roleDlock,
		server:   srvZK,
		renews:   true,
		waitMode: "server-side queue",
		open: func(e *env, o openOpts) (locker, error) {
			dial := func(network, address string, timeout time.Duration) (net.Conn, error) {
				conn, err := net.DialTimeout(network, address, timeout)
				if err != nil {
					return nil, err
				}
				return o.count.wrap(conn), nil
			}
			// The session timeout is the lease TTL: a ZooKeeper lock lives
			// as long as its session.
			_, b, err := zklock.Connect([]string{e.a.ZK}, o.ttl, zklock.WithDialer(dial), zklock.WithLogger(quietLogger{}))
			if err != nil {
				return nil, err
			}
			return newDlockLocker(b, o, nil)
		},
	}
}
