package redislock_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/internal/testserver"
)

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
