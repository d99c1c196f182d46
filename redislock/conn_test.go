package redislock_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/scale"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/redislock"
)

// ownConns returns the connections to srv named name (CLIENT LIST).
func ownConns(t testing.TB, rdb *redis.Client, name string) int {
	t.Helper()
	list, err := rdb.ClientList(context.Background()).Result()
	if err != nil {
		t.Fatalf("CLIENT LIST: %v", err)
	}
	return strings.Count(list, " name="+name+" ")
}

// TestOwnConnection: by default a Backend on a *redis.Client sends its
// scripts on one connection of its own, named as the client's, which the
// client's hooks do not see; WithClientPool sends them through the pool.
func TestOwnConnection(t *testing.T) {
	ctx := ctxT(t, 10*time.Second)
	admin := newRDB(t, srv.Addr())
	for _, pool := range []bool{false, true} {
		t.Run(fmt.Sprintf("pool=%v", pool), func(t *testing.T) {
			name := strings.ReplaceAll(key(t), "/", "-")
			rdb := newRDB(t, srv.Addr(), func(o *redis.Options) { o.ClientName = name })
			seen := 0
			var mu sync.Mutex
			rdb.AddHook(hookFunc(func(cmds []redis.Cmder, _ bool) error {
				mu.Lock()
				defer mu.Unlock()
				for _, c := range cmds {
					if c.Name() == "evalsha" || c.Name() == "eval" {
						seen++
					}
				}
				return nil
			}))
			var opts []redislock.Option
			if pool {
				opts = append(opts, redislock.WithClientPool())
			}
			b := newBackend(t, rdb, opts...)
			var wg sync.WaitGroup
			for i := range 16 {
				wg.Go(func() {
					r := holding(t, b, req(fmt.Sprintf("%s-%d", key(t), i), time.Minute))
					mustRelease(t, b, r)
				})
			}
			wg.Wait()
			mu.Lock()
			got := seen
			mu.Unlock()
			switch {
			case pool && got < 32:
				t.Fatalf("hooks saw %d scripts, want 32 through the pool", got)
			case !pool && got != 0:
				t.Fatalf("hooks saw %d scripts, want 0 (sent on the Backend's connection)", got)
			case !pool:
				n := ownConns(t, admin, name)
				if n < 1 {
					t.Fatalf("no connection named %q", name)
				}
				b.Close()
				waitFor(t, 5*time.Second, "the Backend's connection closed by Close", func() bool { return ownConns(t, admin, name) == n-1 })
				if _, err := b.TryAcquire(ctx, req(key(t), time.Minute)); !errors.Is(err, dlock.ErrClosed) {
					t.Fatalf("TryAcquire after Close: got %v, want ErrClosed", err)
				}
			}
		})
	}
}

// TestOwnConnectionAuthDB: the Backend's connection logs in as the
// client's user and selects its database.
func TestOwnConnectionAuthDB(t *testing.T) {
	ctx := ctxT(t, 10*time.Second)
	admin := newRDB(t, srv.Addr())
	user := strings.ReplaceAll(key(t), "/", "-")
	if err := admin.Do(ctx, "ACL", "SETUSER", user, "on", ">secret", "~*", "&*", "+@all").Err(); err != nil {
		t.Fatalf("ACL SETUSER: %v", err)
	}
	t.Cleanup(func() { admin.Do(context.Background(), "ACL", "DELUSER", user) })
	for _, tc := range []struct {
		name string
		edit func(*redis.Options)
	}{
		{"Password", func(o *redis.Options) { o.Username, o.Password = user, "secret" }},
		{"CredentialsProvider", func(o *redis.Options) {
			o.CredentialsProvider = func() (string, string) { return user, "secret" }
		}},
		{"CredentialsProviderContext", func(o *redis.Options) {
			o.CredentialsProviderContext = func(context.Context) (string, string, error) { return user, "secret", nil }
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rdb := newRDB(t, srv.Addr(), tc.edit, func(o *redis.Options) { o.DB = 3 })
			b := newBackend(t, rdb)
			r := holding(t, b, req(key(t), time.Minute))
			db3 := newRDB(t, srv.Addr(), func(o *redis.Options) { o.DB = 3 })
			if n := db3.Exists(ctx, b.LockName(r.Key)).Val(); n != 1 {
				t.Fatalf("the lock in database 3: %d keys, want 1", n)
			}
			if n := admin.Exists(ctx, b.LockName(r.Key)).Val(); n != 0 {
				t.Fatalf("the lock in database 0: %d keys, want 0", n)
			}
			mustRelease(t, b, r)
		})
	}
	t.Run("DefaultUserPassword", func(t *testing.T) {
		s := ownServer(t)
		if _, err := s.Do(ctx, "CONFIG", "SET", "requirepass", "secret"); err != nil {
			t.Fatalf("CONFIG SET requirepass: %v", err)
		}
		b := newBackend(t, newRDB(t, s.Addr(), func(o *redis.Options) { o.Password = "secret" }))
		mustRelease(t, b, holding(t, b, req(key(t), time.Minute)))
	})
	t.Run("WrongPassword", func(t *testing.T) {
		rdb := newRDB(t, srv.Addr(), func(o *redis.Options) { o.Username, o.Password = user, "wrong" })
		b := newBackend(t, rdb)
		_, err := b.TryAcquire(ctx, req(key(t), time.Minute))
		if err == nil || !strings.Contains(err.Error(), "WRONGPASS") {
			t.Fatalf("TryAcquire with a wrong password: got %v, want WRONGPASS", err)
		}
	})
}

// TestOwnConnectionRecovers: a Backend whose connection was killed, or
// whose server restarted, dials again; calls between fail, none hangs.
func TestOwnConnectionRecovers(t *testing.T) {
	ctx := ctxT(t, 30*time.Second)
	t.Run("ClientKill", func(t *testing.T) {
		name := strings.ReplaceAll(key(t), "/", "-")
		rdb := newRDB(t, srv.Addr(), func(o *redis.Options) { o.ClientName = name })
		b := newBackend(t, rdb)
		mustRelease(t, b, holding(t, b, req(key(t), time.Minute)))
		admin := newRDB(t, srv.Addr())
		if err := admin.Do(ctx, "CLIENT", "KILL", "SKIPME", "yes", "TYPE", "normal").Err(); err != nil {
			t.Fatalf("CLIENT KILL: %v", err)
		}
		recovered(t, ctx, b)
	})
	t.Run("Restart", func(t *testing.T) {
		rdb := newRDB(t, srv2.Addr())
		b := newBackend(t, rdb)
		mustRelease(t, b, holding(t, b, req(key(t), time.Minute)))
		if err := srv2.Kill(); err != nil {
			t.Fatal(err)
		}
		if err := srv2.Restart(); err != nil {
			t.Fatal(err)
		}
		recovered(t, ctx, b)
	})
}

// recovered checks that b's calls succeed again: the first one on Unix,
// where an idle connection is checked before use, within three elsewhere.
func recovered(t *testing.T, ctx context.Context, b *redislock.Backend) {
	t.Helper()
	attempts := 1
	if runtime.GOOS == "windows" {
		attempts = 3
	}
	var err error
	for range attempts {
		r := req(key(t), time.Minute)
		var g dlock.Grant
		if g, err = b.TryAcquire(ctx, r); err == nil {
			if !g.OK {
				t.Fatalf("a fresh key not granted: %+v", g)
			}
			r.Fence = g.Fence
			mustRelease(t, b, r)
			return
		}
	}
	t.Fatalf("calls still fail after the connection was lost: %v", err)
}

// TestOwnConnectionPaused: with the server stopped, calls end with their
// contexts, later ones at the client's ReadTimeout; once it runs again
// the Backend works, and every reply reaches its own call.
func TestOwnConnectionPaused(t *testing.T) {
	s := ownServer(t)
	rdb := newRDB(t, s.Addr(), func(o *redis.Options) {
		o.ReadTimeout = 500 * time.Millisecond
		o.ContextTimeoutEnabled = true
	})
	b := newBackend(t, rdb)
	ctx := ctxT(t, 30*time.Second)
	mustRelease(t, b, holding(t, b, req(key(t), time.Minute)))
	if err := s.Pause(); err != nil {
		t.Fatal(err)
	}
	resumed := false
	defer func() {
		if !resumed {
			s.Resume()
		}
	}()
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	_, err := b.TryAcquire(short, req(key(t), time.Minute))
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("TryAcquire on a stopped server, 100ms deadline: got %v, want DeadlineExceeded", err)
	}
	// No deadline: the ReadTimeout ends it (the connection is given up).
	_, err = b.TryAcquire(context.Background(), req(key(t), time.Minute))
	var ne interface{ Timeout() bool }
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("TryAcquire on a stopped server, no deadline: got %v, want a timeout", err)
	}
	if err := s.Resume(); err != nil {
		t.Fatal(err)
	}
	resumed = true
	// Many goroutines at once, some giving up at once: each grant must be
	// for its own request.
	var wg sync.WaitGroup
	for i := range 64 {
		wg.Go(func() {
			r := req(fmt.Sprintf("%s-%d", key(t), i), time.Minute)
			cctx := ctx
			if i%4 == 0 {
				// Ends about when the call is on the wire.
				c, cancel := context.WithTimeout(ctx, time.Duration(20+i*3)*time.Microsecond)
				defer cancel()
				cctx = c
			}
			g, err := b.TryAcquire(cctx, r)
			if i%4 == 0 {
				return
			}
			if err != nil || !g.OK {
				t.Errorf("TryAcquire %d: %+v, %v", i, g, err)
				return
			}
			info, err := b.Inspect(ctx, r.Key)
			if err != nil || info.Fence != g.Fence || info.Owner != r.Token {
				t.Errorf("lock %d: %+v, %v; want fence %d of %s", i, info, err, g.Fence, r.Token)
			}
		})
	}
	wg.Wait()
}

// TestOwnConnectionDialShared: a caller whose context ends while it
// dials the connection fails with its context's error; a caller waiting
// for that dial does not share that failure but dials again.
func TestOwnConnectionDialShared(t *testing.T) {
	var dials atomic.Int64
	started := make(chan struct{})
	rdb := newRDB(t, srv.Addr(), func(o *redis.Options) {
		var d net.Dialer
		o.Dialer = func(ctx context.Context, network, addr string) (net.Conn, error) {
			if dials.Add(1) == 1 { // the first dial hangs until its caller leaves
				close(started)
				<-ctx.Done()
				return nil, &net.OpError{Op: "dial", Net: network, Err: ctx.Err()}
			}
			return d.DialContext(ctx, network, addr)
		}
	})
	b := newBackend(t, rdb)
	ctx := ctxT(t, 30*time.Second)
	actx, cancel := context.WithCancel(ctx)
	defer cancel()
	aErr := make(chan error, 1)
	go func() {
		_, err := b.TryAcquire(actx, req(key(t)+"-a", time.Minute))
		aErr <- err
	}()
	<-started
	type result struct {
		g   dlock.Grant
		err error
	}
	bRes := make(chan result, 1)
	rb := req(key(t)+"-b", time.Minute)
	go func() {
		g, err := b.TryAcquire(ctx, rb)
		bRes <- result{g, err}
	}()
	waitFor(t, 10*time.Second, "the second caller waiting for the first one's dial", func() bool {
		return dialWaiters() >= 1
	})
	cancel()
	if err := <-aErr; !errors.Is(err, context.Canceled) {
		t.Fatalf("TryAcquire whose context ended during its dial: got %v, want Canceled", err)
	}
	res := <-bRes
	if res.err != nil || !res.g.OK {
		t.Fatalf("TryAcquire waiting for a dial whose caller left: %+v, %v; want a grant", res.g, res.err)
	}
	if n := dials.Load(); n != 2 {
		t.Fatalf("%d dials, want 2 (the abandoned one and the waiter's own)", n)
	}
	rb.Fence = res.g.Fence
	mustRelease(t, b, rb)
}

// dialWaiters counts the goroutines waiting in pipeConn.wire for a dial
// under way on another goroutine.
func dialWaiters() int {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	n := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "[select") && strings.Contains(g, "redislock.(*pipeConn).wire(") && !strings.Contains(g, "dialWire") {
			n++
		}
	}
	return n
}

// ownServer starts a redis-server of the test's own, stopped when it ends.
func ownServer(t *testing.T) *testserver.Redis {
	t.Helper()
	s, err := testserver.StartRedis(testserver.RedisOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Stop() })
	return s
}

// TestOwnConnectionGarbage: a Backend dropped without Close closes its
// connection when it is garbage collected.
func TestOwnConnectionGarbage(t *testing.T) {
	name := strings.ReplaceAll(key(t), "/", "-")
	rdb := newRDB(t, srv.Addr(), func(o *redis.Options) { o.ClientName = name })
	admin := newRDB(t, srv.Addr())
	func() {
		b := redislock.New(rdb)
		r := req(key(t), time.Minute)
		g, err := b.TryAcquire(context.Background(), r)
		if err != nil || !g.OK {
			t.Fatalf("TryAcquire: %+v, %v", g, err)
		}
		r.Fence = g.Fence
		if err := b.Release(context.Background(), r); err != nil {
			t.Fatal(err)
		}
	}()
	waitFor(t, 10*time.Second, "the dropped Backend's connection closed", func() bool {
		runtime.GC()
		return ownConns(t, admin, name) == 0
	})
}

// TestRefreshManyOneWrite: RefreshMany of many leases on the Backend's own
// connection is one request (one write burst, one round trip); after
// SCRIPT FLUSH one more, the NOSCRIPT ones sent again behind one SCRIPT
// LOAD, not each with the script's source.
func TestRefreshManyOneWrite(t *testing.T) {
	var requests atomic.Int64
	rdb := newRDB(t, srv.Addr(), func(o *redis.Options) {
		var d net.Dialer
		o.Dialer = func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := d.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return scale.CountRequests(c, &requests), nil
		}
	})
	b := newBackend(t, rdb)
	admin := newRDB(t, srv.Addr())
	ctx := ctxT(t, 30*time.Second)
	rs := make([]dlock.Request, 500)
	for i := range rs {
		rs[i] = holding(t, b, req(fmt.Sprintf("%s-%d", key(t), i), time.Minute))
	}
	lost := req(key(t), time.Minute)
	rs = append(rs, lost)
	if err := b.Refresh(ctx, rs[0]); err != nil { // refresh.lua loaded
		t.Fatal(err)
	}
	for _, flush := range []bool{false, true} {
		if flush {
			if err := admin.ScriptFlush(ctx).Err(); err != nil {
				t.Fatal(err)
			}
		}
		evals := cmdCalls(t, admin, "eval")
		before := requests.Load()
		errs := b.RefreshMany(ctx, rs)
		sent := requests.Load() - before
		if n := cmdCalls(t, admin, "eval") - evals; n != 0 {
			t.Fatalf("flush=%v: RefreshMany sent %d scripts with their source, want none (one SCRIPT LOAD)", flush, n)
		}
		for i, err := range errs[:len(errs)-1] {
			if err != nil {
				t.Fatalf("flush=%v: refresh %d: %v", flush, i, err)
			}
		}
		if !errors.Is(errs[len(errs)-1], dlock.ErrNotHeld) {
			t.Fatalf("flush=%v: refresh of a lock not held: %v, want ErrNotHeld", flush, errs[len(errs)-1])
		}
		want := int64(1)
		if flush {
			want = 2
		}
		if sent != want {
			t.Fatalf("flush=%v: RefreshMany of %d leases took %d requests, want %d", flush, len(rs), sent, want)
		}
	}
	mustRelease(t, b, rs[:len(rs)-1]...)
}

// watchedConn is a connection that reports its reads and counts the
// script calls written on it (tapConn).
type watchedConn struct {
	net.Conn
	tap *tapConn
}

func (c *watchedConn) Read(p []byte) (int, error) {
	if c.tap.armed.Load() {
		c.tap.once.Do(func() { close(c.tap.reading) })
	}
	return c.Conn.Read(p)
}

func (c *watchedConn) Write(p []byte) (int, error) {
	if c.tap.armed.Load() {
		c.tap.calls.Add(int64(strings.Count(string(p), "EVALSHA")))
	}
	return c.Conn.Write(p)
}

// tapConn is a dialer whose connections are watchedConns: once armed,
// reading is closed at the first read and calls counts EVALSHAs written.
type tapConn struct {
	armed   atomic.Bool
	once    sync.Once
	reading chan struct{}
	calls   atomic.Int64
}

func (tc *tapConn) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &watchedConn{Conn: c, tap: tc}, nil
}

// TestOwnConnectionReaderLeaves: the caller reading the connection
// leaves at its deadline while other calls wait for their replies behind
// its own; they get them once the server answers (a reader goroutine
// takes over), and the grant that came too late for the one who left is
// given back.
func TestOwnConnectionReaderLeaves(t *testing.T) {
	s := ownServer(t)
	tap := &tapConn{reading: make(chan struct{})}
	rdb := newRDB(t, s.Addr(), func(o *redis.Options) { o.Dialer = tap.dial })
	b := newBackend(t, rdb)
	ctx := ctxT(t, 30*time.Second)
	mustRelease(t, b, holding(t, b, req(key(t), time.Minute))) // dialled, scripts loaded
	resume := pause(t, s)
	tap.armed.Store(true)
	left := make(chan error, 1)
	ra := req(key(t)+"-a", time.Minute)
	go func() {
		actx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		_, err := b.TryAcquire(actx, ra)
		left <- err
	}()
	<-tap.reading // a is the reader, blocked on the stopped server
	type result struct {
		r   dlock.Request
		g   dlock.Grant
		err error
	}
	rest := make(chan result, 2)
	for _, name := range []string{"-b", "-c"} {
		go func() {
			r := req(key(t)+name, time.Minute)
			g, err := b.TryAcquire(ctx, r)
			rest <- result{r, g, err}
		}()
	}
	waitFor(t, 10*time.Second, "the three calls written", func() bool { return tap.calls.Load() >= 3 })
	if err := <-left; !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("the reader's TryAcquire: got %v, want DeadlineExceeded", err)
	}
	resume()
	for range 2 {
		select {
		case res := <-rest:
			if res.err != nil || !res.g.OK {
				t.Fatalf("TryAcquire %s waiting behind the reader who left: %+v, %v", res.r.Key, res.g, res.err)
			}
			info, err := b.Inspect(ctx, res.r.Key)
			if err != nil || info.Fence != res.g.Fence || info.Owner != res.r.Token {
				t.Fatalf("lock %s: %+v, %v; want fence %d of %s", res.r.Key, info, err, res.g.Fence, res.r.Token)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("calls waiting behind the reader who left got no reply after the server came back")
		}
	}
	waitFor(t, 10*time.Second, "the late grant of the reader who left given back", func() bool {
		info, err := b.Inspect(ctx, ra.Key)
		return err == nil && !info.Held
	})
}

// TestOwnConnectionTLS: on a client with a TLS config (TLS 1.3) the
// Backend's connection is dialled with the client's TLS dialer and serves
// lone and concurrent calls.
func TestOwnConnectionTLS(t *testing.T) {
	cfg, args := tlsFiles(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	s, err := testserver.StartRedis(testserver.RedisOptions{Args: append(args, "--tls-port", strconv.Itoa(port))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Stop() })
	rdb := newRDB(t, net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), func(o *redis.Options) { o.TLSConfig = cfg })
	b := newBackend(t, rdb)
	for range 3 {
		mustRelease(t, b, holding(t, b, req(key(t), time.Minute)))
	}
	var wg sync.WaitGroup
	for i := range 32 {
		wg.Go(func() { mustRelease(t, b, holding(t, b, req(fmt.Sprintf("%s-%d", key(t), i), time.Minute))) })
	}
	wg.Wait()
}

// tlsFiles writes a self-signed certificate for 127.0.0.1 into the test's
// directory and returns a client config that trusts it and the
// redis-server arguments that serve it.
func tlsFiles(t *testing.T) (*tls.Config, []string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "dlock test"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	if err := os.WriteFile(certFile, certPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(certPEM)
	return &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS13},
		[]string{"--tls-cert-file", certFile, "--tls-key-file", keyFile, "--tls-ca-cert-file", certFile, "--tls-auth-clients", "no"}
}
