package main

import (
	"context"
	"net"
	"time"

	"github.com/go-zookeeper/zk"
)

type quietLogger struct{}

func (quietLogger) Printf(string, ...any) {}

// newZKConn connects to ZooKeeper with a session timeout of ttl; its
// connection counts into c.
func newZKConn(addr string, ttl time.Duration, c *counter) (*zk.Conn, error) {
	dialer := func(network, address string, timeout time.Duration) (net.Conn, error) {
		conn, err := net.DialTimeout(network, address, timeout)
		if err != nil {
			return nil, err
		}
		return c.wrap(conn), nil
	}
	conn, _, err := zk.Connect([]string{addr}, ttl, zk.WithDialer(dialer), zk.WithLogger(quietLogger{}))
	if err != nil {
		return nil, err
	}
	// Wait for the session, so that connection set-up is not measured.
	deadline := time.Now().Add(10 * time.Second)
	for conn.State() != zk.StateHasSession && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	return conn, nil
}

// ---- go-zookeeper zk.Lock ----

func zkLockSubject() *subject {
	return &subject{
		id:       "zk-lock",
		name:     "go-zookeeper zk.Lock",
		role:     rolePeer,
		server:   srvZK,
		renews:   true,
		waitMode: "sequential nodes, watch predecessor",
		open: func(e *env, o openOpts) (locker, error) {
			conn, err := newZKConn(e.a.ZK, o.ttl, o.count)
			if err != nil {
				return nil, err
			}
			return &zkLocker{conn: conn}, nil
		},
	}
}

// zkLocker: zk.Lock takes no context. To keep a run bounded, a context
// that ends while Lock waits closes the connection, which ends the wait.
type zkLocker struct{ conn *zk.Conn }

func (z *zkLocker) lock(ctx context.Context, key string) (held, error) {
	l := zk.NewLock(z.conn, "/bench/"+key, zk.WorldACL(zk.PermAll))
	stop := context.AfterFunc(ctx, z.conn.Close)
	err := l.Lock()
	stop()
	if err != nil {
		return nil, err
	}
	return zkHeld{l, z.conn}, nil
}

func (z *zkLocker) close() error {
	z.conn.Close()
	return nil
}

type zkHeld struct {
	l    *zk.Lock
	conn *zk.Conn
}

func (h zkHeld) unlock(context.Context) error { return h.l.Unlock() }

func (h zkHeld) lost() bool { return h.conn.State() != zk.StateHasSession }
