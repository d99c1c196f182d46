package pglock_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/fence"
	"github.com/dlock-go/dlock/pglock"
)

// A lock kept in PostgreSQL. dsn is a connection URL such as
// "postgres://app@db.internal/app".
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	locks := dlock.New(pglock.New(pool), dlock.WithTTL(10*time.Second))
	defer locks.Close()

	lease, err := locks.Acquire(ctx, "order:1001")
	if err != nil {
		log.Fatal(err)
	}
	defer lease.Release(context.WithoutCancel(ctx))
	fmt.Println("held, fence above zero:", lease.Fence() > 0)
	// Output: held, fence above zero: true
}

// When the data a lock protects lives in the same database, the write can
// commit in the same transaction as the check that the lock is still held:
// Guard verifies the lease's row and locks it until the transaction ends,
// and the fence column rejects a write from any older grant. A holder that
// lost the lock (paused past its TTL, taken over) writes nothing.
func Example_fencedWrite() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS stock (sku text PRIMARY KEY, qty int NOT NULL, fence bigint);
INSERT INTO stock VALUES ('sku-1', 10, NULL) ON CONFLICT (sku) DO UPDATE SET qty = 10, fence = NULL`); err != nil {
		log.Fatal(err)
	}
	backend := pglock.New(pool)
	locks := dlock.New(backend, dlock.WithTTL(10*time.Second))
	defer locks.Close()

	err = locks.Do(ctx, "stock:sku-1", func(ctx context.Context, l *dlock.Lease) error {
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if err := backend.Guard(ctx, tx, l); err != nil {
				return err // matches dlock.ErrLost: nothing is written
			}
			tag, err := tx.Exec(ctx, `UPDATE stock SET qty = qty - 1, fence = $1
WHERE sku = $2 AND `+fence.SQLPredicate("fence", "$1"), int64(l.Fence()), "sku-1")
			if err != nil {
				return err
			}
			if tag.RowsAffected() == 0 {
				return fence.ErrStale // a later grant already wrote
			}
			return nil
		})
	})
	if err != nil {
		log.Fatal(err)
	}
	var qty int
	if err := pool.QueryRow(ctx, "SELECT qty FROM stock WHERE sku = 'sku-1'").Scan(&qty); err != nil {
		log.Fatal(err)
	}
	fmt.Println("left:", qty)
	// Output: left: 9
}
