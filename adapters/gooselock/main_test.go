package gooselock_test

import (
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/locktest/adaptertest"
	"github.com/dlock-go/dlock/pglock"
)

func TestMain(m *testing.M) { adaptertest.Main(m, "gooselock") }

// backends are the servers every framework test runs on: each New returns
// a new connection and backend, as another process would have.
var backends = adaptertest.Backends(pgxpool.New, (*pgxpool.Pool).Close,
	func(p *pgxpool.Pool) dlock.Backend { return pglock.New(p) })

// newClient returns a Client on a new backend, closed when the test ends.
var newClient = adaptertest.NewClient
