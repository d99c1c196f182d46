package gooselock_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"strings"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/adapters/gooselock"
	"github.com/dlock-go/dlock/internal/locktest/adaptertest"
)

// migrations records which migrations ran and whether two ran at once.
type migrations struct {
	mu      sync.Mutex
	inside  int
	overlap int
	runs    map[int64]int
}

func (m *migrations) list() []*goose.Migration {
	var ms []*goose.Migration
	for v := int64(1); v <= 3; v++ {
		ms = append(ms, goose.NewGoMigration(v, &goose.GoFunc{RunDB: func(ctx context.Context, db *sql.DB) error {
			m.mu.Lock()
			if m.inside++; m.inside > 1 {
				m.overlap++
			}
			m.runs[v]++
			m.mu.Unlock()
			defer func() { m.mu.Lock(); m.inside--; m.mu.Unlock() }()
			_, err := db.ExecContext(ctx, "SELECT pg_sleep(0.1)") // a slow migration, outside a transaction
			return err
		}}, nil))
	}
	return ms
}

// newDB creates a database of its own for the test and returns its URL.
func newDB(t *testing.T) string {
	t.Helper()
	name := "mig_" + strings.ToLower(rand.Text()[:8])
	pool, err := pgxpool.New(context.Background(), adaptertest.PostgresDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(context.Background(), "CREATE DATABASE "+name); err != nil {
		t.Fatal(err)
	}
	return strings.Replace(adaptertest.PostgresDSN(), "/postgres?", "/"+name+"?", 1)
}

// open opens the database at url, closed when the test ends.
func open(t *testing.T, url string) *sql.DB {
	t.Helper()
	db, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// Two migrators (each its own Client, database handle and goose Provider)
// run Up on the same database at the same moment: one applies every
// migration, the other waits for the lock and then finds nothing to do.
// No two migrations ever run at once and each runs once.
func TestTwoMigratorsNeverOverlap(t *testing.T) {
	for _, be := range adaptertest.Backends() {
		t.Run(be.Name, func(t *testing.T) {
			url := newDB(t)
			m := &migrations{runs: map[int64]int{}}
			key := "goose:" + rand.Text()[:8]
			var (
				wg        sync.WaitGroup
				mu        sync.Mutex
				applied   []int
				providers []*goose.Provider
			)
			for i := 0; i < 2; i++ {
				locker := gooselock.New(be.Client(t, dlock.WithTTL(2*time.Second)), key)
				p, err := goose.NewProvider(goose.DialectPostgres, open(t, url), fstest.MapFS{},
					goose.WithGoMigrations(m.list()...), goose.WithLocker(locker))
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { p.Close() })
				// Create goose's version table first: goose retries a
				// concurrent creation after a pause, which would keep the
				// two migrators apart even without a lock.
				if _, err := p.GetDBVersion(context.Background()); err != nil {
					t.Fatal(err)
				}
				providers = append(providers, p)
			}
			for i, p := range providers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					res, err := p.Up(context.Background())
					if err != nil {
						t.Errorf("migrator %d Up: %v", i, err)
					}
					mu.Lock()
					applied = append(applied, len(res))
					mu.Unlock()
				}()
			}
			wg.Wait()
			if m.overlap != 0 {
				t.Fatalf("migrations run while another ran: %d, want 0", m.overlap)
			}
			for v := int64(1); v <= 3; v++ {
				if m.runs[v] != 1 {
					t.Fatalf("migration %d ran %d times, want 1 (runs %v)", v, m.runs[v], m.runs)
				}
			}
			if !(applied[0] == 3 && applied[1] == 0 || applied[0] == 0 && applied[1] == 3) {
				t.Fatalf("migrations applied per migrator: got %v, want 3 and 0", applied)
			}
		})
	}
}
