package certmagiclock_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"
	"go.uber.org/zap"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/adapters/certmagiclock"
	"github.com/dlock-go/dlock/internal/locktest"
	"github.com/dlock-go/dlock/internal/locktest/adaptertest"
)

// issuer is a certmagic.Issuer that signs with a throwaway CA, lasts until
// the other instance contends for the name's lock, and records how many
// issuances of a name overlapped another of the same name.
type issuer struct {
	key     *ecdsa.PrivateKey
	overlap atomic.Int32
	issued  atomic.Int32
	mu      sync.Mutex
	inside  map[string]int
	tries   map[string]int           // Lock calls by lock name
	rivals  map[string]chan struct{} // closed at a name's second Lock call
}

// rival returns a channel closed once two Lock calls for the lock name
// have been made.
func (is *issuer) rival(lock string) chan struct{} {
	ch, ok := is.rivals[lock]
	if !ok {
		ch = make(chan struct{})
		is.rivals[lock] = ch
	}
	return ch
}

// tried records a Lock call for the lock name.
func (is *issuer) tried(lock string) {
	is.mu.Lock()
	defer is.mu.Unlock()
	if is.tries[lock]++; is.tries[lock] == 2 {
		close(is.rival(lock))
	}
}

// contending is the storage under test with its Lock calls recorded.
type contending struct {
	*certmagiclock.Storage
	is *issuer
}

func (s contending) Lock(ctx context.Context, name string) error {
	s.is.tried(name)
	return s.Storage.Lock(ctx, name)
}

func (is *issuer) enter(name string) func() {
	is.mu.Lock()
	defer is.mu.Unlock()
	if is.inside[name]++; is.inside[name] > 1 {
		is.overlap.Add(1)
	}
	return func() {
		is.mu.Lock()
		is.inside[name]--
		is.mu.Unlock()
	}
}

func (is *issuer) IssuerKey() string { return "test-ca" }

func (is *issuer) Issue(ctx context.Context, csr *x509.CertificateRequest) (*certmagic.IssuedCertificate, error) {
	defer is.enter(csr.DNSNames[0])()
	// The issuance lasts until the other instance has asked for the same
	// lock: without the lock it would now be issuing the name too.
	is.mu.Lock()
	rival := is.rival("issue_cert_" + csr.DNSNames[0])
	is.mu.Unlock()
	select {
	case <-rival:
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
	is.issued.Add(1)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: csr.DNSNames[0]},
		DNSNames:     csr.DNSNames,
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(90 * 24 * time.Hour),
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, csr.PublicKey, is.key)
	if err != nil {
		return nil, err
	}
	return &certmagic.IssuedCertificate{Certificate: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}, nil
}

// Two certmagic instances sharing a storage obtain the same certificates
// at the same moment: for each name the lock lets one instance issue it
// while the other waits and then loads it from the storage; the two never
// issue the same name at once.
func TestTwoInstancesNeverIssueAtOnce(t *testing.T) {
	for _, be := range adaptertest.Backends() {
		t.Run(be.Name, func(t *testing.T) {
			key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
			if err != nil {
				t.Fatal(err)
			}
			is := &issuer{key: key, inside: map[string]int{}, tries: map[string]int{}, rivals: map[string]chan struct{}{}}
			dir := t.TempDir()
			var cfgs []*certmagic.Config
			var lockers []*certmagiclock.Locker
			for range 2 {
				c := be.Client(t, dlock.WithTTL(2*time.Second))
				locker := certmagiclock.New(c)
				lockers = append(lockers, locker)
				var cfg *certmagic.Config
				cache := certmagic.NewCache(certmagic.CacheOptions{
					GetConfigForCert: func(certmagic.Certificate) (*certmagic.Config, error) { return cfg, nil },
					Logger:           zap.NewNop(),
				})
				t.Cleanup(cache.Stop)
				cfg = certmagic.New(cache, certmagic.Config{
					Storage: contending{certmagiclock.Wrap(&certmagic.FileStorage{Path: dir}, locker), is},
					Issuers: []certmagic.Issuer{is},
					OCSP:    certmagic.OCSPConfig{DisableStapling: true},
					Logger:  zap.NewNop(),
				})
				cfgs = append(cfgs, cfg)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			names := []string{"a.example.com", "b.example.com", "c.example.com"}
			var wg sync.WaitGroup
			for _, name := range names {
				for _, cfg := range cfgs {
					wg.Add(1)
					go func() {
						defer wg.Done()
						if err := cfg.ObtainCertSync(ctx, name); err != nil {
							t.Errorf("ObtainCertSync(%s): %v", name, err)
						}
					}()
				}
			}
			wg.Wait()
			if n := is.overlap.Load(); n != 0 {
				t.Fatalf("issuances overlapping another: %d, want 0", n)
			}
			if n := is.issued.Load(); n != int32(len(names)) {
				t.Fatalf("certificates issued: got %d, want %d (one per name: the second instance loads it)", n, len(names))
			}
			for _, l := range lockers {
				if f := l.Fence("issue_cert_a.example.com"); f != 0 {
					t.Fatalf("Fence of a released lock: got %d, want 0", f)
				}
			}
		})
	}
}

// TryLock reports a held lock without waiting; Unlock of a name not held
// is ErrNotHeld; the fence of a held lock is the lease's.
func TestLockerCalls(t *testing.T) {
	for _, be := range adaptertest.Backends() {
		t.Run(be.Name, func(t *testing.T) {
			ctx := context.Background()
			a := certmagiclock.New(be.Client(t, dlock.WithTTL(2*time.Second)))
			b := certmagiclock.New(be.Client(t, dlock.WithTTL(2*time.Second)))
			name := "issue_cert_" + rand.Text()[:8]
			if ok, err := a.TryLock(ctx, name); !ok || err != nil {
				t.Fatalf("TryLock of a free lock: got %v, %v; want true", ok, err)
			}
			if a.Fence(name) == 0 {
				t.Fatal("Fence of a held lock: got 0")
			}
			if ok, err := b.TryLock(ctx, name); ok || err != nil {
				t.Fatalf("TryLock of a held lock: got %v, %v; want false, nil", ok, err)
			}
			if err := a.RenewLockLease(ctx, name, 5*time.Second); err != nil {
				t.Fatalf("RenewLockLease: %v", err)
			}
			if err := b.Unlock(ctx, name); !errors.Is(err, dlock.ErrNotHeld) {
				t.Fatalf("Unlock by an instance not holding it: got %v, want ErrNotHeld", err)
			}
			if err := a.Unlock(ctx, name); err != nil {
				t.Fatalf("Unlock: %v", err)
			}
			if ok, err := b.TryLock(ctx, name); !ok || err != nil {
				t.Fatalf("TryLock after Unlock: got %v, %v; want true", ok, err)
			}
			b.Unlock(ctx, name)
		})
	}
}

// TestRenewLockLease: certmagic's renewal keeps the Client's TTL (it asks
// for its retry horizon, hours to days); a lost lease is taken again when
// the lock is free, and reported when another instance holds it, whose
// lock Unlock then leaves alone.
func TestRenewLockLease(t *testing.T) {
	onBackends(t, func(t *testing.T, be adaptertest.Backend, ctx context.Context, admin dlock.Backend) {
		a := certmagiclock.New(be.Client(t, dlock.WithTTL(2*time.Second)))
		b := certmagiclock.New(be.Client(t, dlock.WithTTL(2*time.Second)))
		name := "issue_cert_" + rand.Text()[:8]
		key := certmagiclock.KeyPrefix + name
		if ok, err := a.TryLock(ctx, name); !ok || err != nil {
			t.Fatalf("TryLock: got %v, %v; want true", ok, err)
		}
		if err := a.RenewLockLease(ctx, name, 6*time.Hour); err != nil {
			t.Fatalf("RenewLockLease: %v", err)
		}
		if info := inspect(t, ctx, admin, key); !info.Held || info.TTL > 2*time.Second {
			t.Fatalf("after a renewal asking for 6h: %+v, want held with at most the Client's TTL (2s)", info)
		}
		first := a.Fence(name)
		forceRelease(t, ctx, admin, key)
		if err := a.RenewLockLease(ctx, name, time.Minute); err != nil {
			t.Fatalf("RenewLockLease of a lost lease, the lock free: %v", err)
		}
		if f := a.Fence(name); f <= first {
			t.Fatalf("fence after taking it again: %d, want above %d", f, first)
		}
		if ok, err := b.TryLock(ctx, name); ok || err != nil {
			t.Fatalf("TryLock by another instance: got %v, %v; want false, nil", ok, err)
		}
		forceRelease(t, ctx, admin, key)
		if ok, err := b.TryLock(ctx, name); !ok || err != nil {
			t.Fatalf("TryLock by another instance after the loss: got %v, %v; want true", ok, err)
		}
		if err := a.RenewLockLease(ctx, name, time.Minute); err == nil {
			t.Fatal("RenewLockLease of a lease lost to another instance: got nil, want an error")
		}
		if err := a.Unlock(ctx, name); !errors.Is(err, dlock.ErrLost) {
			t.Fatalf("Unlock of the lost lease: got %v, want ErrLost", err)
		}
		if info := inspect(t, ctx, admin, key); !info.Held || info.Fence != b.Fence(name) {
			t.Fatalf("the other instance's lock after the loser's Unlock: %+v, want held with fence %d", info, b.Fence(name))
		}
		if err := b.Unlock(ctx, name); err != nil {
			t.Fatalf("Unlock: %v", err)
		}
	})
}

// TestOneHolderPerNameInProcess: a name certmagic holds in this instance
// is not taken by another goroutine of it, even when the lease was lost
// (the server's lock free): certmagic holds a name from Lock to Unlock.
func TestOneHolderPerNameInProcess(t *testing.T) {
	onBackends(t, func(t *testing.T, be adaptertest.Backend, ctx context.Context, admin dlock.Backend) {
		l := certmagiclock.New(be.Client(t, dlock.WithTTL(2*time.Second)))
		name := "issue_cert_" + rand.Text()[:8]
		if err := l.Lock(ctx, name); err != nil {
			t.Fatal(err)
		}
		forceRelease(t, ctx, admin, certmagiclock.KeyPrefix+name)
		if ok, err := l.TryLock(ctx, name); ok || err != nil {
			t.Fatalf("TryLock by another goroutine: got %v, %v; want false, nil", ok, err)
		}
		short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		defer cancel()
		if err := l.Lock(short, name); !errors.Is(err, dlock.ErrNotAcquired) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Lock by another goroutine: got %v, want ErrNotAcquired and DeadlineExceeded", err)
		}
		got := make(chan error, 1)
		go func() { got <- l.Lock(ctx, name) }()
		if err := l.Unlock(ctx, name); err == nil {
			t.Fatal("Unlock of a lease that was lost: got nil, want an error")
		}
		if err := <-got; err != nil {
			t.Fatalf("Lock after the Unlock: %v", err)
		}
		if err := l.Unlock(ctx, name); err != nil {
			t.Fatalf("Unlock: %v", err)
		}
	})
}

// TestNilLocker: a Locker without a Client returns errors, never panics.
func TestNilLocker(t *testing.T) {
	ctx := context.Background()
	for _, l := range []*certmagiclock.Locker{nil, certmagiclock.New(nil)} {
		s := certmagiclock.Wrap(nil, l)
		if err := s.Lock(ctx, "n"); !errors.Is(err, dlock.ErrInvalidOption) {
			t.Fatalf("Lock: got %v, want ErrInvalidOption", err)
		}
		if _, err := s.TryLock(ctx, "n"); !errors.Is(err, dlock.ErrInvalidOption) {
			t.Fatalf("TryLock: got %v, want ErrInvalidOption", err)
		}
		if err := s.Unlock(ctx, "n"); !errors.Is(err, dlock.ErrInvalidOption) {
			t.Fatalf("Unlock: got %v, want ErrInvalidOption", err)
		}
		if err := s.RenewLockLease(ctx, "n", time.Minute); !errors.Is(err, dlock.ErrInvalidOption) {
			t.Fatalf("RenewLockLease: got %v, want ErrInvalidOption", err)
		}
		if f := l.Fence("n"); f != 0 {
			t.Fatalf("Fence: %d, want 0", f)
		}
	}
}

// onBackends runs test on every backend, with a context and a backend on
// the same server for the test's own looks.
func onBackends(t *testing.T, test func(t *testing.T, be adaptertest.Backend, ctx context.Context, admin dlock.Backend)) {
	for _, be := range adaptertest.Backends() {
		t.Run(be.Name, func(t *testing.T) {
			admin := be.New(t)
			t.Cleanup(func() { admin.Close() })
			test(t, be, locktest.Ctx(t, 30*time.Second), admin)
		})
	}
}

func inspect(t *testing.T, ctx context.Context, b dlock.Backend, key string) dlock.Info {
	t.Helper()
	info, err := b.(dlock.Inspector).Inspect(ctx, key)
	if err != nil {
		t.Fatalf("Inspect: %v", err)
	}
	return info
}

func forceRelease(t *testing.T, ctx context.Context, b dlock.Backend, key string) {
	t.Helper()
	if _, err := b.(dlock.ForceReleaser).ForceRelease(ctx, key); err != nil {
		t.Fatalf("ForceRelease: %v", err)
	}
}
