//go:build unix

package fence_test

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock/fence"
	"github.com/dlock-go/dlock/internal/locktest"
	"github.com/dlock-go/dlock/internal/testserver"
)

// TestSQLPredicateEpochs runs the helpers' statements on PostgreSQL. It
// pins what the package documentation says under Epochs: SQLPredicate
// reads the fence column only, so once a row was written in epoch 1 it
// lets an epoch-0 writer with a larger raw fence through and then locks
// epoch 1's writers out; epoch-0 writers using SQLTokenPredicate with the
// epoch "0" are rejected instead, and behave as SQLPredicate on rows
// without an epoch.
func TestSQLPredicateEpochs(t *testing.T) {
	p := locktest.Own(t, func() (*testserver.Postgres, error) {
		return testserver.StartPostgres(testserver.PostgresOptions{})
	})
	c, err := testserver.DialPG(p.Addr(), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	must := func(sql string) {
		t.Helper()
		if _, err := c.Exec(sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	must(`CREATE TABLE stock (sku text PRIMARY KEY, val text, epoch bigint, fence bigint);
INSERT INTO stock VALUES ('s', 'init', NULL, NULL)`)
	// plain: an epoch-0 writer with SQLPredicate. zero: an epoch-0 writer
	// with SQLTokenPredicate and the epoch "0". token: a writer of an epoch.
	must(`PREPARE plain(bigint, text) AS UPDATE stock SET val = $2, fence = $1
WHERE sku = 's' AND ` + fence.SQLPredicate("fence", "$1"))
	must(`PREPARE zero(bigint, text) AS UPDATE stock SET val = $2, fence = $1
WHERE sku = 's' AND ` + fence.SQLTokenPredicate("epoch", "fence", "0", "$1"))
	must(`PREPARE token(bigint, bigint, text) AS UPDATE stock SET val = $3, epoch = $1, fence = $2
WHERE sku = 's' AND ` + fence.SQLTokenPredicate("epoch", "fence", "$1", "$2"))

	const oldFence = 1_764_000_000_000_000 // a Redis TIME-µs sized fence
	type step struct {
		stmt string // EXECUTE ...
		rows int    // rows updated: 1 accepted, 0 rejected
	}
	run := func(name string, steps []step) {
		t.Helper()
		must(`UPDATE stock SET val = 'init', epoch = NULL, fence = NULL`)
		for i, st := range steps {
			tag, err := c.Exec(st.stmt)
			if err != nil {
				t.Fatalf("%s step %d %s: %v", name, i, st.stmt, err)
			}
			if want := "UPDATE " + strconv.Itoa(st.rows); tag != want {
				t.Errorf("%s step %d %s: got %q, want %q", name, i, st.stmt, tag, want)
			}
		}
	}
	old := func(fn string, fence uint64) string { return fmt.Sprintf("EXECUTE %s(%d, 'old')", fn, fence) }
	epoch1 := func(fence uint64) string { return fmt.Sprintf("EXECUTE token(1, %d, 'new')", fence) }

	run("SQLPredicate", []step{
		{old("plain", oldFence), 1},
		{old("plain", oldFence), 0},   // equal fence: rejected
		{epoch1(12), 1},               // the first write of epoch 1 supersedes it
		{old("plain", oldFence+1), 1}, // SQLPredicate does not see the epoch
		{epoch1(13), 0},               // and epoch 1 is locked out after it
	})
	run("SQLTokenPredicate with epoch 0", []step{
		{old("zero", oldFence), 1},
		{old("zero", oldFence), 0},
		{epoch1(12), 1},
		{old("zero", oldFence+1), 0}, // the old epoch is rejected
		{epoch1(13), 1},
	})
	if tag, err := c.Exec(`DELETE FROM stock WHERE sku = 's' AND val = 'new' AND epoch = 1 AND fence = 13`); err != nil || !strings.HasSuffix(tag, " 1") {
		t.Fatalf("row after the epoch-0 writers with SQLTokenPredicate: got %q, %v; want epoch 1 fence 13", tag, err)
	}
}
