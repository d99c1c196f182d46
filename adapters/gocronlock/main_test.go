package gocronlock_test

import (
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/locktest/adaptertest"
	"github.com/dlock-go/dlock/pglock"
)

func TestMain(m *testing.M) {
	adaptertest.Main(m, "gocronlock", adaptertest.Postgres(pgxpool.New, (*pgxpool.Pool).Close,
		func(p *pgxpool.Pool) dlock.Backend { return pglock.New(p) }))
}
